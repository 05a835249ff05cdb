"""A client that does not read stops the work. A sentence keeps its place in the
pipe until its audio is taken, so generation stops a few sentences past what the client read; a
client that reads slower than the server generates paces its stream's generation (the gateway
tells the `pace` model how far it read: velocity.gateway.pace); a client that takes none of its
audio for VELOCITY_GATEWAY_SEND_TIMEOUT is gone (its speech
stopped, the socket closed, the hang-up counted); a long text has a cap on the whole
(VELOCITY_GATEWAY_LONG_TEXT_MAX_CHARS). The pipe alone, then a gateway of its own in front of the
shared server."""
from __future__ import annotations

import asyncio
import json
import math
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import numpy as np
import pytest
from websockets.sync.client import connect

from client.http_stream import stream_http
from client.triton import model_metric, parse_metric, stream_grpc
from triton_server import LONG_TEXT, assert_work_stops, settle, wait_for
from velocity.gateway.pace import Pacer, read_ahead
from velocity.gateway.sentences import SentencePipe
from velocity.serving.llm.engine_core.core import REPORT_EVERY
from velocity.serving.metrics import PUBLISH_EVERY
from velocity.serving.settings import Settings
from velocity.serving.wire.tts_responses import BEHIND, KEEPS_UP, STEP, AudioChunk, end_frame
from velocity.tts.chunking import FRAMES_PER_SECOND, sample_offset


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


def test_the_server_is_told_only_while_a_client_lags_and_then_that_it_keeps_up():
    async def run() -> tuple[list[int], list[int]]:
        said: list[int] = []

        async def tell(taken: int) -> None:
            said.append(taken)

        async def settle() -> None:
            for _ in range(3):
                await asyncio.sleep(0)

        keeps_up = Pacer(tell)
        for end in range(10, 2000, 10):            # read as it arrives: never told
            keeps_up.received(end)
            keeps_up.read(end)
            await settle()
        quiet, said = said, []
        lags = Pacer(tell)
        lags.received(BEHIND - 1)
        await settle()                             # not yet behind
        lags.received(3 * BEHIND)
        await settle()                             # behind: where it is (nothing read)
        lags.read(STEP - 1)
        await settle()                             # less than a step read: nothing new
        lags.read(STEP)
        await settle()
        lags.read(3 * BEHIND - BEHIND // 2 + 1)
        await settle()                             # back within half of BEHIND: it keeps up
        lags.close()
        lags.received(10 * BEHIND)
        await settle()                             # closed: nothing more
        return quiet, said

    assert asyncio.run(run()) == ([], [0, STEP, KEEPS_UP])


def test_the_gateway_counts_a_chunks_end_in_the_llms_frames():
    for start, lasts, length, last in [(0, 0, 12, False), (12, 0, 8, True), (20, 1, 8, False), (300, 7, 4, True)]:
        samples = length * 512 - (256 if last else 0)
        assert end_frame(sample_offset(start, lasts, 512), samples, lasts) == start + length


def test_a_stream_is_read_ahead_of_its_writer_within_a_bound():
    async def run() -> tuple[int, int, list[int]]:
        made = []

        async def source():
            for i in range(10):
                made.append(i)
                yield AudioChunk(np.zeros(24000, np.float32), offset=i * 24000)

        ahead = read_ahead(source(), held_max_s=3.5)
        first = await anext(ahead)                 # the rest are read while the writer waits
        await asyncio.sleep(0.05)
        held = len(made)
        rest = [c.offset // 24000 async for c in ahead]
        return first.offset, held, rest

    first, held, rest = asyncio.run(run())
    assert first == 0 and held == 5 and rest == list(range(1, 10)), (held, rest)


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


def told_pace(server) -> float:
    return model_metric(server.metrics(), "nv_inference_request_success", "pace")


@dataclass(slots=True)
class Taken:
    """What take_slowly saw: bytes taken, frames the server generated meanwhile, its tellings,
    frames it generated in at least the last half second (NaN: never counted), and its requests
    in flight at the end."""
    got: int
    generated: float
    told: float
    still: float
    active: float

    def assert_paced(self, bound: float) -> None:
        """The server was told, and generated within `bound`. Until its first telling arrives,
        the vocoder alone paces a stream, so on a loaded machine (a telling's round trip through
        HTTP, Triton and the `pace` model's stub is then slow) a fast server may pass the bound
        before it knows: then, once told, it generated nothing more (the last half second), and
        the stream holds its place, paused (it did not just run out of text)."""
        assert self.told >= 1, "the server was never told of the lag"
        if self.generated > bound:
            assert self.still == 0 and self.active >= 1, ("past the bound, and not paused once told", bound, self)


def take_slowly(server, take, within: float = 60.0) -> Taken:
    """take() -> bytes of audio taken, called until the server was told of the lag once, then
    half a second (and the frames counter's lag: it reaches the metrics a core report and a
    publish after the engine made them), then half a second more in which its frames are counted
    again (or `within` seconds: then `still` is NaN). However fast the machine, the reader is
    behind by then. Its counters are the test's own where the test settled the server before it
    began."""
    settle_s = 0.5 + REPORT_EVERY + PUBLISH_EVERY
    def frames() -> float:
        return server.metric("velocity_frames_generated_total")

    frames0, told0 = frames(), told_pace(server)
    got, t0, told_at, next_look = 0, time.monotonic(), None, 0.0
    settled, settled_at = math.nan, None
    while time.monotonic() - t0 < within and (settled_at is None or time.monotonic() - settled_at < 0.5):
        got += take()
        if told_at is None and time.monotonic() >= next_look:
            next_look = time.monotonic() + 0.1
            if told_pace(server) > told0:
                told_at = time.monotonic()
        elif told_at is not None and settled_at is None and time.monotonic() - told_at >= settle_s:
            settled, settled_at = frames(), time.monotonic()
    end = frames()
    return Taken(got, end - frames0, told_pace(server) - told0, end - settled, server.metric("velocity_active_requests"))


@pytest.mark.server
def test_a_post_read_slower_than_it_is_made_pauses_its_generation(tts_server, gateway):
    """One POST of eight sentences (up to 200 frames each on the shared server: 1,600 in all), read
    at a third of real time by a client with a small window, through serve.sh's gateway. The
    gateway tells the `pace` model how far its client read, and the llm pauses the stream once
    VELOCITY_BACKLOG_SECONDS (6) of audio wait to be read: what it generated stays within what
    the client read, what the buffers between them hold, the gateway's 2 s before it tells and
    one sentence ahead (or, told late, nothing more once told: Taken.assert_paced). Unpaced it
    makes the whole text, and `pace` is never told."""
    host, port = gateway.removeprefix("http://").split(":")
    body = json.dumps({"model": "tts-1", "voice": "amber", "input": LONG_TEXT, "response_format": "pcm",
                       "max_new_tokens": 200}).encode()
    settle(tts_server)                                      # the tests before have left
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)

        def take() -> int:
            time.sleep(0.1)
            return len(sock.recv(1600))                     # 16 KB/s: a third of 24 kHz pcm16

        seen = take_slowly(tts_server, take)
    frames = FRAMES_PER_SECOND / 2 / 24000                  # frames per byte of pcm16
    held = (2 * Settings().gateway_send_buffer_bytes + 65536 + 2 * 4096) * frames   # the kernel's (doubled), uvicorn's
    seen.assert_paced(seen.got * frames + held + BEHIND + 6 * FRAMES_PER_SECOND + 200)


@pytest.mark.server
@pytest.mark.parametrize("over", ["grpc", "http"])
def test_our_clients_stream_taken_slower_than_it_is_made_pauses_its_generation(tts_server, over):
    """velocity-tts-client's stream (client.triton.stream_grpc; with --http
    client.http_stream.stream_http, Triton's generate_stream) taken at a third of real time, as a
    player behind a pipe takes it: the client tells the `pace` model how far it took the chunks,
    and the server generates no more than that, its 2 s before telling, the 6 s bound and one
    sentence ahead (or, told late, nothing more once told: Taken.assert_paced). Unpaced it makes
    the whole text (1,600 frames). Leaving early ends the
    HTTP stream's reader at once."""
    values = {"TEXT": LONG_TEXT, "MAX_NEW_TOKENS": 200}
    settle(tts_server)                              # the tests before have left
    chunks = (stream_grpc(tts_server.grpc_url, values, timeout=60) if over == "grpc" else
              stream_http(tts_server.http_url.removeprefix("http://"), values, timeout=60))

    held = 0                                        # samples of the chunk in hand not yet played

    def take() -> int:
        """A tenth of a second of audio at most, in three times as long: the next chunk is asked
        for once the last one is played, and the loop can stop soon after the server is told."""
        nonlocal held
        if not held:
            held = len(next(chunks)[1])
        n = min(held, 2400)
        time.sleep(3 * n / 24000)
        held -= n
        return n

    try:
        seen = take_slowly(tts_server, take)
    finally:
        left = time.monotonic()
        chunks.close()
    assert time.monotonic() - left < 5
    seen.assert_paced(seen.got / 24000 * FRAMES_PER_SECOND + BEHIND + 6 * FRAMES_PER_SECOND + 200)
