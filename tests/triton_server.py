"""Start a real tritonserver (through scripts/serve.sh) on free ports, for tests: the server
handle is benchmarks.server's; here, what only the tests assert with."""
from __future__ import annotations

import contextlib
from pathlib import Path

from benchmarks.server import (ROOT, TritonServer, alive, comm, free_port, listening,  # noqa: F401 (theirs)
                               parse_metric, wait_for)

TESTS_REPO = ROOT / "tests" / "model_repository"


def assert_same_audio(got, want) -> None:
    """The same frames decoded in another batch: the default (hidden-state) path decodes floats
    that another batch composition rounds differently (about 1e-6 relative), so the audio is
    equal in length and within 1e-4 of the peak (DECODER=codes would be bit-exact)."""
    import numpy as np

    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * float(np.abs(want).max()))


def assert_same_pcm(got: bytes, want: bytes) -> None:
    """assert_same_audio for 16-bit pcm: the same frames decoded in another batch, and one
    rounding step to 16 bits either side (2 / 32768 more)."""
    import numpy as np

    g, w = (np.frombuffer(b, "<i2").astype(np.float32) / 32768 for b in (got, want))
    assert g.shape == w.shape and len(g) > 0, (g.shape, w.shape)
    np.testing.assert_allclose(g, w, rtol=0, atol=1e-4 * float(np.abs(w).max()) + 2 / 32768)


def long_text(sentences: int = 8) -> str:
    """A story of this many sentences, each its own engine request."""
    return " ".join(f"This is sentence number {n} of a story that goes on for a while." for n in range(1, sentences + 1))


LONG_TEXT = long_text()


def shm_pattern(s: TritonServer) -> str:
    """The glob of the python backend's /dev/shm regions of this serve.sh run (it prints it)."""
    import re
    m = re.search(r"\[serve\] shared memory: (\S+)", s.log_path.read_text(errors="replace"))
    assert m, s.log()
    return m.group(1)


def is_idle(server: TritonServer) -> bool:
    """No request active and no KV block used, as the server last published (four times a second)."""
    m = server.metrics()
    return parse_metric(m, "velocity_active_requests") == 0 and parse_metric(m, "velocity_kv_blocks_used") == 0


def settle(server: TritonServer, within: float = 30.0) -> None:
    """Wait until the work of the tests before (a client that just left, its cancel not yet
    counted) is over: idle in two scrapes 0.3 s apart, so a counter read next is this test's own."""
    import time

    end = time.monotonic() + within
    while time.monotonic() < end:
        if is_idle(server):
            time.sleep(0.3)
            if is_idle(server):
                return
        time.sleep(0.05)
    raise AssertionError(f"the server was still busy {within:.0f} s on:\n{server.log()[-3000:]}")


def assert_work_stops(server: TritonServer, left_at: float, within: float = 2.0) -> None:
    """A client left at `left_at` (time.monotonic()): within `within` seconds no request is active
    and no KV block is used, and then the frames counter stands still and the vocoder's chunks do
    after at most one more, the decode under way, which is not interrupted (the server stopped
    its work, not just finished it). The metrics are published four times a second, so only a
    scrape 0.3 s or more after the leave counts, the counters are read 0.3 s after the idle
    scrape, and a counter that stands still across 0.4 s has been published again in between."""
    import time

    time.sleep(max(0.0, left_at + 0.3 - time.monotonic()))
    while time.monotonic() < left_at + within and not is_idle(server):
        time.sleep(0.05)
    waited = time.monotonic() - left_at
    assert is_idle(server), f"still busy {waited:.2f} s after the client left:\n{server.log()[-3000:]}"
    time.sleep(0.3)              # the counters are published four times a second too: all up to now
    frames, chunks = (server.metric(c) for c in ("velocity_frames_generated_total", "velocity_vocoder_chunks_total"))
    time.sleep(0.4)
    assert server.metric("velocity_frames_generated_total") == frames, "the llm went on after the server was idle"
    # a decode under way when the client left is not interrupted: at most that one chunk more
    assert server.metric("velocity_vocoder_chunks_total") - chunks <= 1, "the vocoder went on decoding"
    chunks = server.metric("velocity_vocoder_chunks_total")
    time.sleep(0.4)
    assert server.metric("velocity_vocoder_chunks_total") == chunks, "the vocoder went on decoding"
    # its stateful decoder freed (CPU, VELOCITY_VOCODER_STATEFUL): at the cancel the vocoder saw
    assert server.metric("velocity_vocoder_stream_decoders") == 0, "the vocoder holds the decoder of a stream that left"


def llm_inputs(url: str, values: dict) -> list:
    """The llm model's inputs for a TTS request, made by text_frontend (a direct llm caller's)."""
    import tritonclient.grpc as grpcclient

    from client.triton import array_inputs, make_inputs

    fe = grpcclient.InferenceServerClient(url).infer("text_frontend", make_inputs(grpcclient, values))
    names = ["TOKEN_IDS", "SENTENCE_LENGTHS", "SPEAKER_VECTOR", "PARAMS_F", "PARAMS_I"]
    if values.get("REFINE_TEXT"):
        names += ["REFINE_IDS", "REFINE_LENGTHS", "REFINE_PARAMS_F", "REFINE_PARAMS_I", "CODE_PREFIX"]
    if values.get("VOICE_CARRY_OVER"):
        names += ["CARRY_IDS", "CARRY_LENGTHS"]
    return array_inputs(grpcclient, {name: fe.as_numpy(name) for name in names})


@contextlib.contextmanager
def side_gateway(server: TritonServer, log_path: Path, with_process: bool = False, **env: str):
    """A gateway of its own in front of `server`, with these VELOCITY_* settings: its base URL
    (with_process: (the URL, its Popen)). It signs its streams' CLIENT with the server's key."""
    import os
    import subprocess
    import sys

    from benchmarks.replicas import stop_group

    port = free_port()
    gw = subprocess.Popen([sys.executable, "-m", "velocity.gateway.app", "--triton", server.grpc_url, "--host",
                           "127.0.0.1", "--port", str(port)], cwd=ROOT, start_new_session=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "VELOCITY_RUN_DIR": str(server.run_dir), **env},
                          stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: listening(port), 60), log_path.read_text()
        yield (f"http://127.0.0.1:{port}", gw) if with_process else f"http://127.0.0.1:{port}"
    finally:
        stop_group(gw, 20)


def side_by_side(action, servers) -> None:
    """action(server) for each server at the same time, in threads (a server's start is mostly
    loading, its stop unloading: two take little longer than one); the first error raised."""
    import threading

    errors: list[BaseException] = []

    def go(s) -> None:
        try:
            action(s)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=go, args=(s,)) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def simple_request(url: str, body: bytes | None = None, headers: dict | None = None,
                   method: str | None = None, timeout: float = 60) -> tuple[int, bytes]:
    """(status, body) of what any web page may send without a CORS preflight (text/plain, no
    header of its own), with `headers` added."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "text/plain", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def admin_key(server) -> str:
    """The operator key serve.sh made, from the file its log names (only this user may read it)."""
    import stat

    path = server.run_dir / "admin_key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    return path.read_text().strip()


def first_audio(ws, timeout: float = 60) -> bytes:
    """The gateway WebSocket's first audio message, past the words messages that come before it."""
    while isinstance(m := ws.recv(timeout=timeout), str):
        assert '"type": "words"' in m, m
    return m
