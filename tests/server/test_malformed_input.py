"""Every malformed value gets a 4xx (on a socket: an error message) naming the
field, and nothing breaks: the socket goes on. Numbers are checked against their range before any
cast; JSON nesting is bounded (velocity/gateway/json_body.py). Against a real server, through
the gateway that serve.sh starts beside it."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from websockets.sync.client import connect


pytestmark = pytest.mark.server
BODY = {"model": "tts-1", "input": "Hi.", "voice": "amber", "response_format": "pcm", "max_new_tokens": 4}
DEEP = "[" * 100_000 + "]" * 100_000
SETUP = {"type": "setup", "model": "tts-1", "voice": "amber", "max_new_tokens": 4}


def post(gateway: str, data: bytes) -> tuple[int, dict | bytes]:
    req = urllib.request.Request(gateway + "/v1/audio/speech", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("field,value,says", [
    ("voice", [], "voice is required"),
    ("response_format", {}, "response_format must be one of"),
    ("stream_format", ["sse"], "stream_format must be"),
    ("seed", 10**30, "seed must be in [0, 2^63)"),
    ("max_new_tokens", 2**32 + 3, "max_new_tokens must be in [1, "),
    ("top_k", 2**40, "top_k must be >= 0 and at most 2147483647"),
    ("speaker_seed", -1, None),                 # not an API field: ignored, the request is fine
])
def test_a_malformed_field_gets_a_400_naming_it(gateway, field, value, says):
    status, got = post(gateway, json.dumps(BODY | {field: value}).encode())
    if says is None:
        assert status == 200 and len(got) > 0
        return
    assert status == 400, (status, got)
    err = got["error"]
    assert says in err["message"] and err["param"] == field and err["type"] == "invalid_request_error", err


def test_nesting_past_the_bound_gets_a_400_and_the_server_goes_on(gateway):
    status, got = post(gateway, DEEP.encode())
    assert status == 400 and "nests arrays and objects more than 32 deep" in got["error"]["message"], got
    lexicon = {"lexicon": {"Hi": "hello"}}                          # a body's own nesting is fine
    status, audio = post(gateway, json.dumps(BODY | lexicon).encode())
    assert status == 200 and len(audio) > 0


def speech_socket(gateway: str):
    return connect(gateway.replace("http://", "ws://") + "/v1/audio/speech/stream")


@pytest.mark.parametrize("msg,says,param", [
    (json.dumps(SETUP | {"seed": 10**30}), "seed must be in [0, 2^63)", "seed"),
    (json.dumps(SETUP | {"max_new_tokens": 2**32 + 3}), "max_new_tokens must be in [1, ", "max_new_tokens"),
    (json.dumps(SETUP | {"response_format": {}}), "response_format must be", "response_format"),
    (DEEP, "nests arrays and objects more than 32 deep", None),
])
def test_the_speech_socket_answers_a_malformed_message_and_goes_on(gateway, msg, says, param):
    with speech_socket(gateway) as ws:
        ws.send(msg)
        err = json.loads(ws.recv(timeout=30))
        assert err["type"] == "error" and says in err["message"] and err["param"] == param, err
        ws.send(json.dumps(SETUP))
        assert json.loads(ws.recv(timeout=30)) == {"type": "ready"}


@pytest.mark.parametrize("msg,says", [
    ({"text": " ", "context_id": "a", "voice_settings": [1.1]}, "voice_settings must be an object"),
    ({"text": " ", "context_id": "a", "voice_settings": "fast"}, "voice_settings must be an object"),
    ({"text": " ", "context_id": "a", "voice_settings": {"speed": True}}, "voice_settings.speed must be a number"),
    (DEEP, "nests arrays and objects more than 32 deep"),
])
def test_the_elevenlabs_socket_answers_a_malformed_message_and_goes_on(gateway, msg, says):
    url = gateway.replace("http://", "ws://") + "/v1/text-to-speech/amber/multi-stream-input?output_format=pcm_24000"
    with connect(url) as ws:
        ws.send(msg if isinstance(msg, str) else json.dumps(msg))
        err = json.loads(ws.recv(timeout=30))
        assert err["error"] == "invalid_message" and says in err["message"], err
        ws.send(json.dumps({"text": " ", "context_id": "b"}))              # the socket goes on
        ws.send(json.dumps({"context_id": "b", "close_context": True}))
        assert json.loads(ws.recv(timeout=30)) == {"isFinal": True, "contextId": "b"}


def test_the_nesting_bound_counts_brackets_first_and_scans_only_past_the_bound():
    """A body with no more opening brackets than the bound (a large lexicon has two) is not
    scanned; past it the scan decides, and brackets inside strings do not nest."""
    from velocity.gateway.json_body import MAX_DEPTH, depth, loads

    lexicon = json.dumps(BODY | {"lexicon": {f"w{k}": "word" for k in range(3000)}})
    assert depth(lexicon) == 2 and loads(lexicon, "body")["lexicon"]["w2999"] == "word"
    wide = json.dumps([[] for _ in range(2 * MAX_DEPTH)])             # many brackets, 2 deep
    assert depth(wide) == 2 and len(loads(wide, "body")) == 2 * MAX_DEPTH
    quoted = json.dumps({"input": "[" * (2 * MAX_DEPTH)})               # brackets in a string
    assert depth(quoted) == 1 and loads(quoted, "body")["input"].startswith("[[")
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    assert depth(deep) == MAX_DEPTH + 1
    assert depth("[" * MAX_DEPTH + "]" * MAX_DEPTH) == MAX_DEPTH
