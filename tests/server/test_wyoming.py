"""velocity-tts-wyoming against the real server, with the `wyoming` package's own client:
describe lists the server's voices; synthesize streams audio-start / audio-chunk / audio-stop
holding the audio `tts` streams for the same request; streamed text is spoken sentence by
sentence; an error is an `error` event and the connection goes on."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from client.triton import stream_grpc
from triton_server import (LONG_TEXT, ROOT, assert_same_pcm, assert_work_stops, free_port, listening, settle,
                           wait_for)
from velocity.gateway.encode import pcm16
from velocity.tts.text_pieces import split_complete

pytestmark = pytest.mark.server
SEED = 3


@pytest.fixture(scope="module")
def wyoming(tts_server):
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "velocity.gateway.wyoming_server", "--uri", f"tcp://127.0.0.1:{port}",
                          "--triton", tts_server.grpc_url, "--seed", str(SEED)], cwd=ROOT, start_new_session=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert wait_for(lambda: listening(port), 30), p.stdout.read1().decode() if p.poll() is not None else "not listening"
    yield port
    os.killpg(p.pid, signal.SIGTERM)
    p.wait(timeout=30)


def talk(port: int, *events, until: tuple = ("audio-stop", "error")) -> list:
    """Send the events on one connection; the events read back up to one of type `until`."""
    from wyoming.client import AsyncTcpClient

    async def run():
        got = []
        async with AsyncTcpClient("127.0.0.1", port) as c:
            for e in events:
                await c.write_event(e.event())
            while (e := await asyncio.wait_for(c.read_event(), 120)) is not None:
                got.append(e)
                if e.type in until:
                    break
        return got
    return asyncio.run(run())


def direct_pcm(tts_server, text: str, voice: str) -> bytes:
    """The same request straight to `tts` over gRPC, as 16-bit pcm."""
    return b"".join(pcm16(a) for _, a in stream_grpc(tts_server.grpc_url, {"TEXT": text, "VOICE": voice,
                                                                          "SEED": SEED}, timeout=120))


def test_describe_lists_the_servers_voices(wyoming, tts_server):
    import json
    import urllib.request

    from wyoming.info import Describe, Info
    info = Info.from_event(talk(wyoming, Describe(), until=("info",))[0])
    listing = json.loads(urllib.request.urlopen(tts_server.gateway_url + "/v1/audio/voices", timeout=10).read())
    # OpenAI's voice names are aliases for the OpenAI API: not listed to Home Assistant
    assert [v.name for v in info.tts[0].voices] == [v["name"] for v in listing["details"] if v["kind"] != "alias"]
    assert info.tts[0].supports_synthesize_streaming


def test_synthesize_streams_the_servers_audio(wyoming, tts_server):
    from wyoming.audio import AudioChunk, AudioStart
    from wyoming.tts import Synthesize, SynthesizeVoice
    events = talk(wyoming, Synthesize(text="Hello from Wyoming.", voice=SynthesizeVoice(name="basil")))
    types = [e.type for e in events]
    assert types[0] == "audio-start" and types[-1] == "audio-stop" and set(types[1:-1]) == {"audio-chunk"}, types
    start = AudioStart.from_event(events[0])
    assert (start.rate, start.width, start.channels) == (24000, 2, 1)
    assert len(events) > 3                                  # streamed in chunks, not one block
    audio = b"".join(AudioChunk.from_event(e).audio for e in events[1:-1])
    assert_same_pcm(audio, direct_pcm(tts_server, "Hello from Wyoming.", "basil"))


def test_streamed_text_is_spoken_sentence_by_sentence(wyoming, tts_server):
    from wyoming.audio import AudioChunk
    from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice
    events = talk(wyoming, SynthesizeStart(voice=SynthesizeVoice(name="amber")),
                  *[SynthesizeChunk(text=t) for t in ("It is 3.", "14 now. Are", " you there? Yes")],
                  Synthesize(text="It is 3.14 now. Are you there? Yes"),      # for old servers: ignored
                  SynthesizeStop(), until=("synthesize-stopped",))
    assert events[-1].type == "synthesize-stopped"
    spoken, current = [], None
    for e in events[:-1]:
        if e.type == "audio-start":
            current = b""
        elif e.type == "audio-chunk":
            current += AudioChunk.from_event(e).audio
        elif e.type == "audio-stop":
            spoken.append(current)
    sentences = ["It is 3.14 now.", "Are you there?", "Yes"]
    assert len(spoken) == len(sentences)
    for got, text in zip(spoken, sentences):
        assert_same_pcm(got, direct_pcm(tts_server, text, "amber"))


def test_an_error_is_an_error_event_and_the_connection_goes_on(wyoming):
    from wyoming.error import Error
    from wyoming.info import Describe
    from wyoming.tts import Synthesize, SynthesizeVoice
    events = talk(wyoming, Synthesize(text="x" * 2001), Describe(), until=("info",))
    err = Error.from_event(events[0])
    assert "TEXT has 2001 characters; the limit is 2000" in err.text and err.code == "http_400"
    assert events[-1].type == "info"
    err = Error.from_event(talk(wyoming, Synthesize(text="Hi.", voice=SynthesizeVoice(name="nobody")))[0])
    assert "nobody" in err.text


def test_streamed_text_is_bounded_as_on_the_sockets(wyoming):
    """On Wyoming (tests/server/test_buffers.py has the sockets'): 30,000 sentences in one
    chunk queue MAX_QUEUED, then an error event says the rest were dropped, and the connection goes
    on; text with no sentence end is spoken once it passes MAX_PENDING_CHARS."""
    from wyoming.error import Error
    from wyoming.info import Describe
    from wyoming.tts import SynthesizeChunk, SynthesizeStart, SynthesizeVoice

    from velocity.gateway.sentences import MAX_QUEUED
    events = talk(wyoming, SynthesizeStart(voice=SynthesizeVoice(name="amber")), SynthesizeChunk(text="Hi. " * 30_000),
                  Describe(), until=("error",))
    err = Error.from_event(events[-1])
    assert err.code == "queue_full" and f"{MAX_QUEUED} sentences wait to be spoken" in err.text, err
    events = talk(wyoming, SynthesizeStart(voice=SynthesizeVoice(name="amber")),
                  *[SynthesizeChunk(text="word " * 200) for _ in range(3)], until=("audio-stop", "error"))
    assert events[-1].type == "audio-stop"               # spoken with no sentence end and no stop


def cancelled(server) -> float:
    return server.metric('velocity_aborted_requests_total{model="llm",reason="cancelled"}')


def test_a_connection_that_closes_mid_speech_stops_the_work(wyoming, tts_server):
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize

    async def leave() -> float:
        async with AsyncTcpClient("127.0.0.1", wyoming) as c:
            await c.write_event(Synthesize(text=LONG_TEXT).event())
            while (e := await asyncio.wait_for(c.read_event(), 120)).type != "audio-chunk":
                pass
        return time.monotonic()                             # closed with audio still to come

    settle(tts_server)                                      # the test before's last sentence cancelled
    before = cancelled(tts_server)
    assert_work_stops(tts_server, asyncio.run(leave()))
    assert cancelled(tts_server) == before + 1


def test_a_new_synthesize_while_speaking_barges_in(wyoming, tts_server):
    """The first text's audio ends (audio-stop) soon after the second synthesize, its server work
    stops within 2 s, and the second text is spoken in full, as it would be alone."""
    from wyoming.audio import AudioChunk
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize

    async def barge_in() -> tuple[list, float]:
        async with AsyncTcpClient("127.0.0.1", wyoming) as c:
            await c.write_event(Synthesize(text=LONG_TEXT).event())
            while (e := await asyncio.wait_for(c.read_event(), 120)).type != "audio-chunk":
                pass
            await c.write_event(Synthesize(text="Sorry, go on.").event())
            at, got = time.monotonic(), []
            while (e := await asyncio.wait_for(c.read_event(), 120)) is not None:
                got.append(e)
                if [x.type for x in got].count("audio-stop") == 2:
                    break
        return got, at

    before = cancelled(tts_server)
    events, at = asyncio.run(barge_in())
    types = [e.type for e in events]
    first_stop = types.index("audio-stop")
    assert set(types[:first_stop]) <= {"audio-chunk"}, types       # the rest of the first text: cut
    second = types[first_stop + 1:]
    assert second[0] == "audio-start" and second[-1] == "audio-stop" and set(second[1:-1]) == {"audio-chunk"}, types
    assert wait_for(lambda: cancelled(tts_server) == before + 1, max(0.1, at + 2 - time.monotonic()))
    audio = b"".join(AudioChunk.from_event(e).audio for e in events[first_stop + 2:-1])
    assert_same_pcm(audio, direct_pcm(tts_server, "Sorry, go on.", "amber"))
    assert_work_stops(tts_server, time.monotonic())


@pytest.mark.parametrize("text,done,rest", [
    ("It is 3.14", [], "It is 3.14"),
    ("One. Two", ["One."], "Two"),
    ("Really?! Yes. ", ["Really?!", "Yes."], ""),
    ("你好。今天", ["你好。"], "今天"),
])
def test_split_complete(text, done, rest):
    assert split_complete(text) == (done, rest)
