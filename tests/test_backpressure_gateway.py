"""Issue #45, item 5: a client that does not read stops the work. A sentence keeps its place in the
pipe until its audio is taken, so generation stops a few sentences past what the client read; a
client that takes none of its audio for VELOCITY_GATEWAY_SEND_TIMEOUT is gone (its speech
stopped, the socket closed, the hang-up counted); a long text has a cap on the whole
(VELOCITY_GATEWAY_LONG_TEXT_MAX_CHARS). The pipe alone, then a gateway of its own in front of the
shared server."""
from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.error
import urllib.request

import pytest
from websockets.sync.client import connect

from client.triton import parse_metric
from triton_server import LONG_TEXT, assert_work_stops, wait_for
from velocity.gateway.sentences import SentencePipe


def test_generation_stops_a_few_sentences_past_the_reader():
    async def run() -> list[int]:
        started = []

        async def stream(text: str):
            started.append(text)
            yield f"{text} audio"

        pipe, seen = SentencePipe(stream, ahead=2), []
        for i in range(10):
            pipe.add(f"s{i}")
        await asyncio.sleep(0.05)
        seen.append(len(started))                       # nobody reads: 3 places, 3 sentences
        out = pipe.out()
        for _ in range(2):                              # read s0 whole: its audio, then its end
            await anext(out)
        await asyncio.sleep(0.05)
        seen.append(len(started))                       # s0's place freed: one more began
        await pipe.cancel()
        return seen

    assert asyncio.run(run()) == [3, 4]


def disconnects(gateway: str) -> float:
    return parse_metric(urllib.request.urlopen(gateway + "/metrics", timeout=10).read().decode(),
                        "velocity_gateway_disconnects_total")


@pytest.mark.server
def test_a_client_that_reads_nothing_is_gone_after_the_send_timeout(tts_server, side_gw):
    """The side gateway (conftest.SIDE_GATEWAY_ENV): gone after 2 s, a 16 KB kernel send buffer,
    long texts in pieces of at most 80 characters and 500 in all."""
    gw, log = side_gw
    before = disconnects(gw)
    host, port = gw.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)       # a small window, never read
    sock.connect((host, int(port)))
    # max_queue=1: the client library itself stops reading the socket after one message
    with connect(gw.replace("http://", "ws://") + "/v1/audio/speech/stream", sock=sock, max_queue=1,
                 close_timeout=1) as ws:
        ws.send(json.dumps({"type": "setup", "model": "tts-1", "voice": "amber", "max_new_tokens": 200}))
        ws.send(json.dumps({"type": "text", "text": LONG_TEXT * 4}))
        sent = time.monotonic()
        assert wait_for(lambda: disconnects(gw) == before + 1, 60), log.read_text()[-2000:]
        gone = time.monotonic()
        assert_work_stops(tts_server, gone)
        assert "took none of its audio for 2 s" in log.read_text()
        assert gone - sent < 60
    body = {"model": "tts-1", "voice": "amber", "input": "word " * 120, "response_format": "pcm"}
    req = urllib.request.Request(gw + "/v1/audio/speech", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    err = json.loads(e.value.read())["error"]
    assert e.value.code == 400 and err["param"] == "input" and "a long text may have 500" in err["message"], err
