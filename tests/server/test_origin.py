"""Same origin by default. Another site's page cannot open the WebSockets (403)
nor make the server speak with a no-CORS POST (415); the gateway's own page, programs that send no
Origin and the origins of VELOCITY_GATEWAY_ORIGINS can. A real server, its gateway and a gateway
of its own with an allow-list."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect


pytestmark = pytest.mark.server
BODY = {"model": "tts-1", "input": "Hi.", "voice": "amber", "response_format": "pcm", "max_new_tokens": 4}
PATHS = ("/v1/audio/speech/stream", "/v1/text-to-speech/amber/multi-stream-input?output_format=pcm_24000")


def opens(gateway: str, path: str, origin: str | None) -> bool:
    """The socket's handshake succeeds with this Origin header (None: none sent)."""
    url = gateway.replace("http://", "ws://") + path
    try:
        with connect(url, origin=origin, open_timeout=30):
            return True
    except InvalidStatus as e:
        assert e.response.status_code == 403, e
        return False


@pytest.mark.parametrize("path", PATHS)
def test_a_page_of_another_origin_cannot_open_the_sockets(gateway, path):
    own = gateway                                             # http://127.0.0.1:<port>, as the page is served
    assert not opens(gateway, path, "http://evil.example")
    assert not opens(gateway, path, own.replace("127.0.0.1", "evil.example"))    # same port, other host
    assert opens(gateway, path, own)                          # the gateway's own page
    assert opens(gateway, path, None)                         # a program: no Origin


def post(gateway: str, content_type: str | None) -> int:
    headers = {"Content-Type": content_type} if content_type else {}
    req = urllib.request.Request(gateway + "/v1/audio/speech", data=json.dumps(BODY).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        err = json.loads(e.read())["error"]
        assert "Content-Type: application/json" in err["message"] and err["type"] == "invalid_request_error", err
        return e.code


def test_speech_takes_only_a_json_body(gateway):
    assert post(gateway, "text/plain") == 415                # what a page may send anywhere unasked
    assert post(gateway, "application/x-www-form-urlencoded") == 415
    assert post(gateway, None) == 415                         # urllib's default is form-encoded
    assert post(gateway, "application/json; charset=utf-8") == 200


def test_an_allowed_origin_may_open_the_sockets(side_gw):
    gw, log = side_gw                                   # VELOCITY_GATEWAY_ORIGINS=https://app.example
    for path in PATHS:
        assert opens(gw, path, "https://app.example")
        assert not opens(gw, path, "https://other.example")
    assert "refused the page at 'https://other.example'" in log.read_text()
