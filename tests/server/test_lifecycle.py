"""The request limit and the drain on stop, against one real server.

VELOCITY_MAX_CONCURRENT_REQUESTS=2: with two long streams in flight a third request is refused
with a message naming the limit; cancelling one frees its slot. Then SIGTERM to serve.sh: a
stream that can finish within DRAIN_TIMEOUT finishes, new requests are refused, a stream that
cannot is ended with an error, and the server exits cleanly (no exit-timeout abort) leaving no
process behind.

The long streams have 40 sentences of up to 2000 frames each (minutes of generation on this
machine); the test needs them alive only for the milliseconds a refused request takes, and
ends them itself (cancel, drain).
"""
from __future__ import annotations

import queue
import signal
import threading
import time

import pytest
import tritonclient.grpc as grpcclient

from benchmarks.server import http_status
from benchmarks.soak import BAD_LLM, call_llm
from client.triton import ServerError, stream_grpc
from test_lexicon_limits import post

from triton_server import ROOT, alive, llm_inputs, wait_for
from velocity.serving.vocoder.jobs import stream_error
from velocity.serving.wire.protocol import STREAM_SHUTTING_DOWN
from velocity.serving.settings import Settings
from checkpoints import tiny_checkpoint

pytestmark = pytest.mark.server
DRAIN = 12          # seconds: the medium stream needs about 3 (its audio decoded), 9 with both cores busy elsewhere; the long one waits it out
# after the drain: unloading (Triton's default). The vocoder's backlog no longer outlasts the
# drain: the llm pauses a stream with VELOCITY_BACKLOG_SECONDS of audio waiting for the vocoder,
# a stream ended by the drain has its queued chunks dropped, and a finished one sends its final
# flag only once its audio is decoded (60 s were needed when the tiny llm ran unbounded ahead).
EXIT = 30
LONG = {"TEXT": "This sentence goes on. " * 40, "MAX_NEW_TOKENS": 2000, "REPETITION_PENALTY": 1.0}
SHORT_POST = {"model": "tts-1", "voice": "amber", "response_format": "pcm", "max_new_tokens": 20}


class Listener(threading.Thread):
    """One `tts` stream on its own thread: chunks, then "complete" or the error, with times.
    realtime: its audio taken as a player takes it (a chunk's length after it), so that the
    server paces the stream to real time: a long text then lasts as long as its audio, however
    fast the machine generates it."""

    def __init__(self, url: str, values: dict, realtime: bool = False) -> None:
        super().__init__(daemon=True)
        self.url, self.values, self.realtime = url, values, realtime
        self.first = threading.Event()
        self.leave = threading.Event()          # set: hang up at the next chunk (outcome "left")
        self.chunks = 0
        self.outcome: tuple[str, str] | None = None
        self.ended_at = 0.0

    def run(self) -> None:
        try:
            for _, audio in stream_grpc(self.url, self.values, timeout=300):
                self.chunks += 1
                self.first.set()
                if self.realtime:
                    self.leave.wait(len(audio) / 24000)
                if self.leave.is_set():
                    self.outcome = ("left", "")
                    break
            else:
                self.outcome = ("complete", "")
        except ServerError as e:
            self.outcome = ("error", str(e))
        except Exception as e:            # a dropped connection: an answer too, but not the one we want
            self.outcome = ("disconnected", repr(e))
        self.ended_at = time.monotonic()
        self.first.set()


def gateway_health(s) -> int:
    """The status of the gateway's GET /health."""
    return http_status(s.gateway_url + "/health")


def refusal(url: str, text: str = "Am I let in?") -> str | None:
    try:
        list(stream_grpc(url, {"TEXT": text, "MAX_NEW_TOKENS": 20, "SEED": 1}, timeout=120))
        return None
    except ServerError as e:
        return str(e)


def test_request_limit_then_drain_on_stop(start_triton, tmp_path):
    ckpt = tiny_checkpoint(tmp_path / "tiny", seed=0, small_audio=True)
    s = start_triton(ROOT / "model_repository", env={
        "VELOCITY_WEIGHTS": str(ckpt), "VELOCITY_MAX_CONCURRENT_REQUESTS": "2", "VELOCITY_MAX_DIRECT_REQUESTS": "0", "VELOCITY_MAX_TEXT_CHARS": "5000",
        "DRAIN_TIMEOUT": str(DRAIN), "EXIT_TIMEOUT": str(EXIT)})

    # malformed direct llm calls are refused, name the input, and give their slot back: with
    # the limit at 2 they used to lock every later request out ("server busy")
    for arrays, names in zip(BAD_LLM[:3], ["TOKEN_IDS, sentence 0", "SPEAKER_VECTOR", "PARAMS_I[1]"]):
        chunks, error = call_llm(s.grpc_url, arrays)
        assert chunks == 0 and error is not None and names in error, error
    assert "max_new_tokens) must be in [1, 2048]" in error
    assert wait_for(lambda: s.metric("velocity_active_requests") == 0)

    # two long streams: one straight to the llm (cancellable), one through the ensemble
    direct = grpcclient.InferenceServerClient(s.grpc_url)
    got: queue.Queue = queue.Queue()
    direct.start_stream(callback=lambda result, error: got.put((result, error)))
    direct.async_stream_infer("llm", llm_inputs(s.grpc_url, {**LONG, "SEED": 1}), enable_empty_final_response=True)
    first, err = got.get(timeout=120)
    assert err is None and first.as_numpy("CODES") is not None
    long = Listener(s.grpc_url, {**LONG, "SEED": 2}, realtime=True)      # minutes of audio
    long.start()
    assert long.first.wait(120) and long.outcome is None, long.outcome

    # full: the third is refused, with the limit and the setting that raises it
    msg = refusal(s.grpc_url)
    assert msg is not None and "server busy: 2 requests are in flight" in msg
    assert "VELOCITY_MAX_CONCURRENT_REQUESTS" in msg
    assert wait_for(lambda: s.metric("velocity_refused_requests_total") == 1
                    and s.metric("velocity_active_requests") == 2)
    # and through the gateway: a 503 that says so. (The gateway used to cancel a request after
    # its error; Triton then kept that ensemble request in flight for good, and the stop below
    # waited out its exit timeout: the log check at the end.)
    for i in range(12):            # each such cancel could leave a request behind: 12 catch it nearly always
        status, error = post(s.gateway_url, {**SHORT_POST, "input": f"Am I let in through the gateway, {i}?"})
        assert status == 503 and "server busy" in error["message"], (status, error)

    # cancel the direct one: its slot comes back and a request goes through
    direct.stop_stream(cancel_requests=True)
    direct.close()
    assert wait_for(lambda: s.metric("velocity_active_requests") == 1, timeout=60)
    assert refusal(s.grpc_url) is None

    # a stream that can finish within the drain, live when the server is told to stop
    medium = Listener(s.grpc_url, {"TEXT": "A medium stream. It has two sentences.", "MAX_NEW_TOKENS": 400,
                                   "REPETITION_PENALTY": 1.0, "SEED": 3})
    medium.start()
    assert medium.first.wait(120) and medium.outcome is None, medium.outcome
    pids = s.processes()
    assert s.health("ready", port=s.health_port)
    assert gateway_health(s) == 200
    t_stop = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)

    # draining: new requests are refused (one sent before the llm sees the drain may get in);
    # Triton still says ready, serve.sh's health port says not ready (what balancers probe), and
    # so does the gateway's /health (it asks the server's `voices` model, which sees the drain)
    assert wait_for(lambda: "[serve] draining" in s.log(), timeout=10), s.log()
    assert not s.health("ready", port=s.health_port) and s.health("ready")
    assert wait_for(lambda: gateway_health(s) == 503, timeout=5)
    deadline = time.monotonic() + 10
    while (msg := refusal(s.grpc_url)) is None or "new requests are refused" not in msg:
        assert time.monotonic() < deadline, f"still admitting new requests while draining: {msg}"
    assert "shutting down" in msg
    for i in range(12):
        status, error = post(s.gateway_url, {**SHORT_POST, "input": f"Am I let in while it drains, {i}?"})
        assert status == 503 and "shutting down" in error["message"], (status, error)

    medium.join(DRAIN + 60)
    long.join(DRAIN + 60)
    assert medium.outcome == ("complete", "") and medium.ended_at > t_stop, (medium.outcome, medium.ended_at - t_stop)
    assert long.outcome is not None and long.outcome[0] == "error", long.outcome
    assert stream_error(STREAM_SHUTTING_DOWN, Settings())[0] in long.outcome[1]
    assert long.ended_at - t_stop >= DRAIN - 1          # it had its grace period

    rc = s.proc.wait(DRAIN + 60)
    stopped_after = time.monotonic() - t_stop
    log = s.log()
    assert rc == 143 and "[serve] drained" in log, log
    # on failure, what Triton said while it stopped: which models it still waited for, and why
    unload = "\n".join(line for line in log.splitlines() if any(
        w in line for w in ("[serve]", "in-flight", "unload", "Exit timeout", "Signal", "Error", "error")))
    assert "Exit timeout expired" not in log and "Signal (6)" not in log, unload
    assert stopped_after < DRAIN + EXIT, f"stopping took {stopped_after:.0f} s"
    assert wait_for(lambda: not [p for p in pids if alive(p)]), "a server or stub process was left behind"


class GatewayListener(threading.Thread):
    """One speech request through the gateway on its own thread: its pcm bytes, or the error."""

    def __init__(self, url: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.url, self.body, self.first = url, body, threading.Event()
        self.audio, self.outcome = b"", None

    def run(self) -> None:
        import json
        import urllib.request
        req = urllib.request.Request(self.url + "/v1/audio/speech", data=json.dumps(self.body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=180) as r:
                while part := r.read1(4096):
                    self.audio += part
                    self.first.set()
            self.outcome = "complete"
        except Exception as e:
            self.outcome = f"error: {e!r}"
        self.first.set()
