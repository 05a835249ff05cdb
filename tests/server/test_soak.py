"""A bounded soak (12 s in CI; `python -m benchmarks.soak` runs it for longer): concurrent streams
(voices named, seeded and sampled, some with text refine), cancellations and bad requests against one server, then idle KV cache, no running sequences,
resident memory back within the stated margin, every good request's audio complete. The
vocoder batches chunks on this server (VELOCITY_VOCODER_BATCH=4, the GPU's default is 32)."""
from __future__ import annotations

import json
import re
import time
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from benchmarks.soak import TEXTS, soak
from client.triton import array_inputs
from triton_server import ROOT, TritonServer, wait_for
from checkpoints import tiny_checkpoint

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("soak")
    ckpt = tiny_checkpoint(d / "tiny", seed=0)
    s = TritonServer(repo=ROOT / "model_repository", log_path=d / "server.log",
                     env={"VELOCITY_WEIGHTS": str(ckpt), "VELOCITY_KV_CACHE_BYTES": str(2 << 20),
                          "VELOCITY_CHUNK_FIRST": "4", "VELOCITY_CHUNK_REST": "8", "VELOCITY_LOOKAHEAD": "4",
                          # the GPU's way on CPU: queued chunks of one length decoded in one call
                          "VELOCITY_VOCODER_BATCH": "4"})
    s.start(timeout=400)
    yield s
    s.stop(at_once=True)


def test_the_server_runs_on_the_folder_the_reference_loaded(server):
    """The served folder (the release-size audio models: the other servers' small ones the
    reference cannot load) is byte for byte the one the conformance fixtures were recorded on,
    which the reference loaded strictly: `make serve` on a reference-loadable folder is ready."""
    from velocity.release import sha256_file

    manifest = json.loads((ROOT / "tests" / "fixtures" / "chattts_0.2.5" / "manifest.json").read_text())

    folder = Path(server.env["VELOCITY_WEIGHTS"])
    for name, sha in manifest["demo"]["sha256"].items():
        assert sha256_file(folder / name) == sha, name


def vocoder_inputs(codes: np.ndarray, context: int, length: int, index: int) -> list:
    return array_inputs(grpcclient, {"CODES": codes[None].astype(np.int32), "CONTEXT": np.array([[context]], np.int32),
                                     "LENGTH": np.array([[length]], np.int32),
                                     "CHUNK_INDEX": np.array([[index]], np.int32)})


def test_vocoder_batches_queued_chunks_and_refuses_bad_codes(server):
    """Chunks queued behind a long one are decoded in one call (fewer calls than chunks) and each
    gets its own audio (within float32 rounding of a batched convolution: 1e-4 of the peak, as
    tests/unit/tts/test_streaming_decode.py); bad codes are refused with INVALID_ARG naming the range, alone.
    The vocoder is decoupled (it answers a probe with nothing): a direct caller streams."""
    rng = np.random.default_rng(0)
    chunks = [rng.integers(0, 625, (4, 24)) for _ in range(4)]
    time.sleep(0.3)              # the counters are published four times a second: all of the tests before
    chunks_before, calls_before = (server.metric(f"velocity_vocoder_{m}_total") for m in ("chunks", "calls"))
    got, lock = {}, threading.Lock()

    def keep(result, error):
        with lock:
            got[len(got)] = (result, error)

    g = grpcclient.InferenceServerClient(server.grpc_url)
    g.start_stream(callback=keep)
    g.async_stream_infer("vocoder", vocoder_inputs(rng.integers(0, 625, (4, 600)), 0, 600, 0))
    for i, c in enumerate(chunks):                     # queued while the long chunk decodes
        g.async_stream_infer("vocoder", vocoder_inputs(c, 4, 16, i + 1))
    assert wait_for(lambda: len(got) == 5, 300), got
    g.stop_stream()
    assert all(err is None for _, err in got.values()), got
    by_index = {int(r.as_numpy("CHUNK_INDEX").reshape(-1)[0]): r for r, _ in got.values()}
    # the counters are published four times a second (velocity.serving.metrics)
    assert wait_for(lambda: server.metric("velocity_vocoder_chunks_total") - chunks_before == 5, 2)
    assert server.metric("velocity_vocoder_calls_total") - calls_before < 5
    for i, c in enumerate(chunks):
        alone, error = vocoder_once(server, vocoder_inputs(c, 4, 16, i + 1))
        batched = by_index[i + 1].as_numpy("WAVEFORM")
        assert error is None and batched.shape == alone.as_numpy("WAVEFORM").shape == (1, 16 * 512)
        np.testing.assert_allclose(batched, alone.as_numpy("WAVEFORM"), rtol=0,
                                   atol=1e-4 * np.abs(alone.as_numpy("WAVEFORM")).max())
    bad = chunks[0].copy()
    bad[2, 5] = 625
    for codes, match in [(bad, r"CODES must hold codes in \[0, 625\), got values in \[\d+, 625\]"),
                         (chunks[0][:3], r"CODES must be \[1, 4, frames\], got \[1, 3, 24\]"),
                         (chunks[0], "does not hold CONTEXT=20 \\+ LENGTH=16 frames")]:
        _, error = vocoder_once(server, vocoder_inputs(codes, 20 if codes is chunks[0] else 4, 16, 1))
        assert isinstance(error, InferenceServerException) and re.search(match, error.message()), error
    result, error = vocoder_once(server, vocoder_inputs(chunks[1], 4, 16, 2))
    assert error is None and result.as_numpy("WAVEFORM").shape == (1, 16 * 512)


def vocoder_once(server, inputs: list):
    """One chunk on a gRPC stream of its own: (result, error)."""
    import queue
    q: queue.Queue = queue.Queue()
    g = grpcclient.InferenceServerClient(server.grpc_url)
    g.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        g.async_stream_infer("vocoder", inputs)
        return q.get(timeout=120)
    finally:
        g.stop_stream()


def test_soak(server):
    """The four clients' seeded choices hold every kind of request within their first three
    requests each, so a slow machine that gets through fewer requests still sends them all."""
    rep = soak(server.grpc_url, f"http://localhost:{server.metrics_port}/metrics", seconds=12, pid=server.proc.pid,
               concurrency=4, max_new=40,
               texts=[t for t in TEXTS if t.isascii()])   # the tiny demo vocabulary lacks most Chinese characters
    assert rep["ok"], f"{rep}\n{server.log()[-3000:]}"
    assert min(rep["requests"].get(k, 0) for k in ("good complete", "cancelled", "bad rejected", "bad llm rejected",
                                                          "with a sample", "with a named voice", "refined")) > 0, rep
