"""An encoder is closed at every end of its response. mp3 requests cut off
mid-stream leave no FFmpeg threads behind in the gateway (each open encoder holds a few); the
gateway's thread count returns to its baseline. A gateway of its own (its process is counted) in
front of the shared server."""
from __future__ import annotations

import http.client
import json
import os
import threading
import urllib.parse

import pytest

from triton_server import LONG_TEXT, side_gateway, wait_for

pytestmark = pytest.mark.server


def cut_off(url: str, fmt: str) -> None:
    """One streamed request, hung up after its first audio bytes."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    body = {"model": "tts-1", "input": LONG_TEXT, "voice": "amber", "response_format": fmt}
    conn.request("POST", "/v1/audio/speech", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200 and r.read1(1024)
    conn.close()                                    # leave mid-stream


def test_hang_ups_leave_no_encoder_threads(tts_server, tmp_path):
    with side_gateway(tts_server, tmp_path / "gateway.log", with_process=True) as (url, proc):
        def threads() -> int:
            return len(os.listdir(f"/proc/{proc.pid}/task"))

        cut_off(url, "mp3")                         # the first: PyAV's imports and pools
        base = threads()
        for _ in range(2):                          # two bursts of 8, as the attack
            burst = [threading.Thread(target=cut_off, args=(url, fmt)) for fmt in ("mp3", "aac", "opus", "flac") * 2]
            for t in burst:
                t.start()
            for t in burst:
                t.join()
        assert wait_for(lambda: threads() <= base, 10), f"{threads()} threads, {base} before the hang-ups"
