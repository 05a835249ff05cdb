"""A bounded soak (90 s in CI; `python -m client.soak` runs it for longer): concurrent streams,
cancellations and bad requests against one server, then idle KV cache, no running sequences,
resident memory back within the stated margin, every good request's audio complete."""
from __future__ import annotations

import pytest

from client.soak import TEXTS, soak
from triton_server import ROOT, TritonServer
from velocity.tts.checkpoint import write_checkpoint

pytestmark = pytest.mark.server


def test_soak(tmp_path):
    ckpt = write_checkpoint(tmp_path / "tiny", "tiny", seed=0)
    s = TritonServer(repo=ROOT / "model_repository", log_path=tmp_path / "server.log",
                     env={"VELOCITY_WEIGHTS": str(ckpt), "VELOCITY_KV_CACHE_BYTES": str(2 << 20),
                          "VELOCITY_CHUNK_FIRST": "4", "VELOCITY_CHUNK_REST": "8", "VELOCITY_LOOKAHEAD": "4"})
    s.start(timeout=400)
    try:
        rep = soak(s.grpc_url, f"http://localhost:{s.metrics_port}/metrics", seconds=90, pid=s.proc.pid,
                   concurrency=4, max_new=40,
                   texts=[t for t in TEXTS if t.isascii()])   # the tiny demo vocabulary lacks most Chinese characters
        assert rep["ok"], f"{rep}\n{s.log()[-3000:]}"
        assert min(rep["requests"].get(k, 0) for k in ("good complete", "cancelled", "bad rejected")) > 0, rep
    finally:
        s.stop()
