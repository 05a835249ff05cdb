"""When a part dies, every client hears it within 2 s, readiness says so within 2 s,
and the server comes back by itself (a new request speaks within 60 s).

One server as `make serve` starts it (serve.sh: Triton, the health port with its watchdog, the
gateway and Wyoming), and SIGKILL to each part (the llm's engine core among them) in turn while
streams are live on the
protocols a user has: a gRPC `tts` stream and a /v1/audio/speech stream at every kill, and by
turns SSE, our WebSocket, ElevenLabs' WebSocket, Wyoming and a `tts_offline` request; after
each, nothing of the dead server is left (its stubs, its /dev/shm regions, which a bare
tritonserver killed would leave behind), and the gateways' error messages name the part
(serve.sh gives them the health port, whose watchdog names it). tts_offline dies while idle itself (the streams beside
it are `tts`'s) and must be replaced before the next offline request needs it. Then the same
seeded request as on the fresh server: the same audio, nothing held (no state crosses a
recovery). Last, one SIGTERM to the `make serve` group drains and stops it all.
"""
from __future__ import annotations

import asyncio
import glob
import http.client
import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from urllib.parse import urlparse

import numpy as np
import pytest

from benchmarks.server import http_status, pgid
from client.http_stream import stream_http
from client.triton import ServerError, stream_grpc
from test_lifecycle import GatewayListener, Listener
from triton_server import (ROOT, TritonServer, alive, comm, free_port, listening, parse_metric, settle,
                          shm_pattern, wait_for)
from checkpoints import tiny_checkpoint
from velocity.gateway.encode import pcm16
from velocity.serving.lifecycle.watchdog import DIED, UNNAMED

pytestmark = pytest.mark.server
LONG = "This sentence goes on for a while. " * 24          # minutes of audio: live at the kill
TOLD = 2.0              # seconds: every client hears the failure, and readiness turns 503
BACK = 60.0             # seconds: a new request speaks again
NAMED = {"sse", "websocket", "elevenlabs", "wyoming"}   # the clients whose error carries a message of the gateway's
SEEDED = {"TEXT": "The same words, the same seed.", "SEED": 7, "MAX_NEW_TOKENS": 60}
PARTS = ["llm", "llm engine", "vocoder", "text_frontend", "tts_offline", "tritonserver"]
DRAIN = 12              # seconds: the SIGTERM test's streams finish within it


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`make serve` with Wyoming on; the last test of the module stops it (a SIGTERM)."""
    d = tmp_path_factory.mktemp("part_death")
    s = TritonServer(repo=ROOT / "model_repository", log_path=d / "server.log", via_make=True,
                     env={"VELOCITY_WEIGHTS": str(tiny_checkpoint(d / "tiny", seed=0, small_audio=True)),
                          "WYOMING_PORT": str(free_port()), "DRAIN_TIMEOUT": str(DRAIN), "EXIT_TIMEOUT": "10"}).start()
    s.wyoming_port = int(s.env["WYOMING_PORT"])
    s.ckpt = d / "tiny"
    assert wait_for(lambda: http_status(s.gateway_url + "/health") == 200, 30), s.log()
    try:
        yield s
    finally:
        s.stop()


class Client(threading.Thread):
    """One live stream on its own thread: run(first) calls first() at its first audio, then
    returns normally if its audio ended as whole, or raises; outcome and the time it ended."""

    def __init__(self, name: str, run: Callable[[Callable[[], None]], None]) -> None:
        super().__init__(daemon=True, name=name)
        self.body, self.first = run, threading.Event()
        self.outcome: str | None = None
        self.ended_at = 0.0

    def run(self) -> None:
        try:
            self.body(self.first.set)
            self.outcome = "complete"
        except Exception as e:
            self.outcome = f"error: {e!r}"[:1000]
        self.ended_at = time.monotonic()
        self.first.set()


def grpc_stream(s: TritonServer) -> Client:
    def run(first) -> None:
        for _ in stream_grpc(s.grpc_url, {"TEXT": LONG, "MAX_NEW_TOKENS": 2000}, timeout=120):
            first()
    return Client("grpc", run)


def http_stream(s: TritonServer) -> Client:
    """Triton's HTTP generate_stream (server-sent events): an error event ends it."""
    def run(first) -> None:
        for _ in stream_http(s.http_url.removeprefix("http://"), {"TEXT": LONG, "MAX_NEW_TOKENS": 2000}, timeout=120,
                             key=s.triton_key):
            first()
    return Client("http", run)


def post(s: TritonServer, sse: bool = False) -> Client:
    """/v1/audio/speech read as it comes; a cut response (no last chunk) raises IncompleteRead,
    and on SSE the stream must end with an `error` event (raised here)."""
    def run(first) -> None:
        u = urlparse(s.gateway_url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
        body = {"model": "tts-1", "voice": "amber", "input": LONG, "response_format": "pcm",
                "max_new_tokens": 2000} | ({"stream_format": "sse"} if sse else {})
        conn.request("POST", "/v1/audio/speech", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200, (r.status, r.read())
        if not sse:
            while r.read1(65536):
                first()
            return
        for line in r:
            if line.startswith(b"data: "):
                event = json.loads(line[6:])
                if event["type"] == "error":
                    raise RuntimeError(f"error event: {event['error']['message']}")
                first()
    return Client("sse" if sse else "post", run)


def socket(s: TritonServer, elevenlabs: bool = False) -> Client:
    """Our WebSocket or ElevenLabs': an error message, then the close code 1012 (service restart)."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    base = s.gateway_url.replace("http://", "ws://")
    def run(first) -> None:
        url = (base + "/v1/text-to-speech/amber/multi-stream-input?output_format=pcm_24000" if elevenlabs
               else base + "/v1/audio/speech/stream")
        errors = []
        with connect(url) as ws:
            if elevenlabs:
                ws.send(json.dumps({"text": LONG, "context_id": "a"}))
                ws.send(json.dumps({"context_id": "a", "flush": True}))
            else:
                ws.send(json.dumps({"type": "setup", "model": "tts-1", "voice": "amber", "max_new_tokens": 2000}))
                ws.send(json.dumps({"type": "text", "text": LONG}))
                ws.send(json.dumps({"type": "flush"}))
            try:
                while True:
                    m = ws.recv(timeout=120)
                    msg = None if isinstance(m, bytes) else json.loads(m)
                    if msg is None or msg.get("audio"):
                        first()
                    elif msg.get("error") or msg.get("type") == "error":
                        errors.append(msg)
            except ConnectionClosed as e:
                raise RuntimeError(f"closed {e.rcvd.code if e.rcvd else None} after {errors}") from None
    return Client("elevenlabs" if elevenlabs else "websocket", run)


def wyoming(s: TritonServer) -> Client:
    def run(first) -> None:
        from wyoming.client import AsyncTcpClient
        from wyoming.error import Error
        from wyoming.tts import Synthesize

        async def talk() -> None:
            async with AsyncTcpClient("127.0.0.1", s.wyoming_port) as c:
                await c.write_event(Synthesize(text=LONG).event())
                while (e := await asyncio.wait_for(c.read_event(), 120)) is not None:
                    if e.type == "audio-chunk":
                        first()
                    elif e.type == "error":
                        raise RuntimeError(f"error event: {Error.from_event(e).text}")
                    elif e.type == "audio-stop":
                        return
        asyncio.run(talk())
    return Client("wyoming", run)


def offline(s: TritonServer) -> Client:
    """A whole-file request in flight (no audio before its end: first() once it is sent)."""
    def run(first) -> None:
        import tritonclient.http as httpclient

        from velocity.serving.wire.input_table import make_inputs
        with httpclient.InferenceServerClient(s.http_url.removeprefix("http://"), network_timeout=120) as c:
            threading.Timer(0.5, first).start()
            c.infer("tts_offline", make_inputs(httpclient, {"TEXT": LONG, "MAX_NEW_TOKENS": 2000}),
                    headers=s.http_headers)
    return Client("offline", run)


def failures(s: TritonServer, part: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{s.health_port}/metrics", timeout=5) as r:
        return parse_metric(r.read().decode(), f'velocity_part_failures_total{{part="{part}"}}')


def speaks(s: TritonServer) -> bool:
    try:
        return sum(len(a) for _, a in stream_grpc(s.grpc_url, {"TEXT": "Back again.", "MAX_NEW_TOKENS": 30},
                                                  timeout=30)) > 0
    except ServerError:
        return False


def seeded_pcm(s: TritonServer) -> bytes:
    return b"".join(pcm16(a) for _, a in stream_grpc(s.grpc_url, SEEDED, timeout=120))


def kill_and_recover(s: TritonServer, part: str, clients: list[Client]) -> None:
    """Items 1-3 for one part: the clients' errors and readiness within TOLD, a request that
    speaks within BACK, the failure counted."""
    before = failures(s, part)
    for c in clients:
        c.start()
    for c in clients:
        assert c.first.wait(120) and c.outcome is None, (c.name, c.outcome, s.log()[-3000:])
    pid = s.part_pid(part)
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    health, gateway = s.health_port, s.gateway_url + "/health"
    assert wait_for(lambda: http_status(f"http://127.0.0.1:{health}/v2/health/ready") == 503
                    and http_status(gateway) == 503, TOLD), f"{part}: still ready {TOLD} s after its death"
    for c in clients:
        c.join(max(0.1, t_kill + TOLD + 1 - time.monotonic()))
    late = {c.name: c.outcome for c in clients if c.outcome is None or c.ended_at - t_kill > TOLD}
    assert not late, f"{part} killed: clients not told within {TOLD} s: {late}\n{s.log()[-4000:]}"
    whole = {c.name: c.outcome for c in clients if not c.outcome.startswith("error")}
    assert not whole, f"{part} killed: streams that ended as if whole: {whole}"
    # the gateways' messages name the part (their health port's reason); so do Triton's own
    # streams where the part is not on their path (the llm and the vocoder live to name it); a
    # plain POST's body can only be cut
    named = NAMED | ({"grpc", "http"} if part not in UNNAMED else set())
    unnamed = {c.name: c.outcome for c in clients if c.name in named and f"the {part} {DIED}" not in c.outcome}
    assert not unnamed, f"{part} killed: errors that do not name it: {unnamed}"
    assert wait_for(lambda: http_status(f"http://127.0.0.1:{health}/v2/health/ready") == 200 and speaks(s),
                    t_kill + BACK - time.monotonic()), f"{part}: not back in {BACK} s\n{s.log()[-4000:]}"
    assert wait_for(lambda: http_status(gateway) == 200, 10), "the gateway did not see the server back"
    assert failures(s, part) == before + 1


def offline_speaks(s: TritonServer) -> bool:
    import tritonclient.http as httpclient

    from velocity.serving.wire.input_table import make_inputs
    with httpclient.InferenceServerClient(s.http_url.removeprefix("http://"), network_timeout=60) as c:
        return c.infer("tts_offline", make_inputs(httpclient, {"TEXT": "Whole.", "MAX_NEW_TOKENS": 30}),
                       headers=s.http_headers).as_numpy("WAVEFORM").size > 0


def test_each_part_that_dies_is_told_seen_and_replaced(served):
    """tts_offline dies while no request of its own runs (the `tts` streams beside it do): it
    is replaced before the next offline request needs it."""
    s = served
    fresh = seeded_pcm(s)
    # "llm engine": the llm's engine core, a process of its own: its stub tells every stream (naming
    # it: the llm lives to), then ends itself for the watchdog to see
    turns = {"llm": [socket(s), wyoming(s)], "llm engine": [post(s, sse=True)],
             "vocoder": [post(s, sse=True), socket(s, elevenlabs=True)],
             "text_frontend": [offline(s)], "tts_offline": [], "tritonserver": []}
    assert list(turns) == PARTS
    for part, extra in turns.items():
        server = s.part_pid("tritonserver")
        group = [p for p in s.processes() if pgid(p) == server]      # the server and its stubs
        regions = glob.glob(shm_pattern(s))
        assert regions, "the running server has shared-memory regions under serve.sh's name"
        kill_and_recover(s, part, [grpc_stream(s), http_stream(s), post(s), *extra])
        # nothing of the dead server is left: its processes, its /dev/shm regions
        assert [(p, comm(p)) for p in group if alive(p)] == [], part
        assert [r for r in regions if os.path.exists(r)] == [], part
        if part == "tts_offline":
            assert offline_speaks(s)
    log = s.log_path.read_text(errors="replace")
    for part in turns:
        assert f"the {part} model's process" in log or f"the {part} process" in log or part == "tritonserver", part

    # no state across a recovery: nothing held, and the same request gives the same audio
    settle(s, within=10)                                   # no request active, no KV block used
    again = seeded_pcm(s)
    assert len(again) == len(fresh) and np.array_equal(np.frombuffer(again, np.int16), np.frombuffer(fresh, np.int16))


def test_one_sigterm_to_the_make_serve_group_drains(served):
    """`kill -- -PGID` on `make serve` (what systemd, `timeout` and docker stop on a make-based
    entrypoint do) reaches make and serve.sh, and make passes its SIGTERM on: serve.sh sees two.
    It must still drain (after the restarts above too): the live streams finish, the one through
    the gateway (which make serve started beside Triton) too, no restart follows, and nothing is
    left, the gateway and Wyoming included."""
    s = served
    log = s.log_path.read_text(errors="replace")
    assert f"[serve] Wyoming tcp://localhost:{s.wyoming_port}\n" in log
    assert listening(s.wyoming_port), log[-3000:]
    assert f"weights:      {s.ckpt}" in log                          # VELOCITY_WEIGHTS reaches serve.sh
    assert f"[serve] gRPC    localhost:{s.grpc_port}\n" in log       # where to connect, as the README says
    assert f"[serve] OpenAI  http://localhost:{s.gateway_port}/v1/audio/speech" in log
    live = Listener(s.grpc_url, {"TEXT": "A stream that is live when the group is told to stop.",
                                 "MAX_NEW_TOKENS": 150, "REPETITION_PENALTY": 1.0, "SEED": 3})
    spoken = GatewayListener(s.gateway_url, {"model": "tts-1", "voice": "amber", "response_format": "pcm",
                                             "input": "A stream through the gateway.", "max_new_tokens": 150,
                                             "seed": 4})
    live.start()
    spoken.start()
    assert live.first.wait(120) and live.outcome is None, live.outcome
    assert spoken.first.wait(120) and spoken.outcome is None, spoken.outcome
    pids = s.processes()
    os.killpg(s.proc.pid, signal.SIGTERM)
    live.join(DRAIN + 60)
    spoken.join(DRAIN + 60)
    assert live.outcome == ("complete", ""), live.outcome
    assert spoken.outcome == "complete" and len(spoken.audio) > 0, spoken.outcome
    s.proc.wait(DRAIN + 60)
    log = s.log_path.read_text(errors="replace")
    assert "[serve] draining" in log and "[serve] drained" in log, log[-3000:]
    assert "not waiting for the drain" not in log, log[-3000:]
    assert log.count("starting it again") == len(PARTS), log[-3000:]            # none after the stop
    assert wait_for(lambda: not [p for p in pids if alive(p)]), "a server or stub process was left behind"
    assert not listening(s.wyoming_port)
