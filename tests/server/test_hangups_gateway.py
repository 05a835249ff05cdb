"""Every hang-up stops the work within 2 s and is counted. A WebSocket client
that sends `close` and leaves before its audio is out (the close loop waited for ever before: the
writer could not send, and the text was spoken for no one), and a slow reader of a long text in
pieces that hangs up (its small receive window keeps the gateway's sends waiting; this one passed
on the code before too, here: the issue saw two requests still running 3 s later, which the
response that closes its generator at once, item 9's, rules out). Against the shared server (its work: assert_work_stops) through the
gateways: serve.sh's, and one of its own for long texts."""
from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time
import urllib.parse
import urllib.request

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from client.triton import parse_metric
from triton_server import LONG_TEXT, assert_work_stops, first_audio

pytestmark = pytest.mark.server


def disconnects(gateway: str) -> float:
    text = urllib.request.urlopen(gateway + "/metrics", timeout=10).read().decode()
    return parse_metric(text, "velocity_gateway_disconnects_total")


def test_close_then_leave_stops_the_work(gateway, tts_server):
    before = disconnects(gateway)
    with contextlib.suppress(OSError, ConnectionClosed), \
            connect(gateway.replace("http://", "ws://") + "/v1/audio/speech/stream") as ws:
        ws.send(json.dumps({"type": "setup", "model": "tts-1", "voice": "amber", "max_new_tokens": 200}))
        assert json.loads(ws.recv(timeout=30)) == {"type": "ready"}
        ws.send(json.dumps({"type": "text", "text": LONG_TEXT}))
        first_audio(ws)                                         # its audio has begun
        ws.send(json.dumps({"type": "close"}))                  # speak the rest, then close ...
        ws.socket.shutdown(socket.SHUT_RDWR)                    # ... but the client is gone
    assert_work_stops(tts_server, time.monotonic())
    assert disconnects(gateway) == before + 1


def test_a_slow_reader_of_a_long_text_that_hangs_up_stops_the_work(tts_server, side_gw):
    gw, _ = side_gw                                     # long texts in pieces (conftest.SIDE_GATEWAY_ENV)
    before = disconnects(gw)
    u = urllib.parse.urlsplit(gw)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.sock = socket.socket()
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)     # a slow reader's small window
    conn.sock.connect((u.hostname, u.port))
    body = {"model": "tts-1", "voice": "amber", "input": LONG_TEXT[:480], "response_format": "pcm",
            "max_new_tokens": 200}
    conn.request("POST", "/v1/audio/speech", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    for _ in range(3):                                  # reads a little now and then: the
        assert r.read1(4096)                            # gateway's sends wait on it
        time.sleep(0.5)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    assert_work_stops(tts_server, time.monotonic())
    assert disconnects(gw) == before + 1


def test_unary_calls_whose_callers_leave_leave_triton_up(tts_server):
    """The gateway's unary calls to Triton (here `pace`, as a Pacer makes them) with their callers
    cancelled at any moment, 2,000 times, as clients that hang up cancel them. Triton 2.51's gRPC
    frontend (the pytriton wheel's) crashes on a unary infer cancelled as it completes
    (triton-inference-server/server#8034): without Gateway.uncancelled this killed the server
    within these calls here (docs/operations.md). The calls run to their end, and tritonserver
    stays the same."""
    import asyncio
    import random

    from tritonclient.utils import InferenceServerException

    from velocity.gateway.upstream import Gateway

    server, log0 = tts_server.part_pid("tritonserver"), len(tts_server.log_path.read_bytes())
    url = tts_server.grpc_url
    unknown = 2**62 + 7                          # no stream's reference: the board ignores it

    async def leave_calls() -> None:
        gw = Gateway(url)
        try:
            for i in range(2000):
                call = asyncio.ensure_future(gw._pace(url, unknown, i))
                await asyncio.sleep(random.random() * 0.004)
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError, InferenceServerException):
                    await call          # an error here: the server is gone (asserted below)
        finally:
            await gw.close()

    asyncio.run(leave_calls())
    after = tts_server.log_path.read_bytes()[log0:].decode(errors="replace")
    assert "Signal (11)" not in after, after[-3000:]
    assert tts_server.part_pid("tritonserver") == server
