"""Overload: four times more concurrent streams than the KV cache holds. Every stream completes
with the audio it gets alone (seeded: the same frames; the audio within float rounding on the
default hidden-state path), no error, and the preemptions show in the metrics."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from client.triton import ServerError, stream_grpc
from triton_server import ROOT, TritonServer, assert_same_audio, wait_for
from checkpoints import tiny_checkpoint

pytestmark = pytest.mark.server
BLOCK_BYTES = 2 * 2 * 16 * 64 * 4      # k and v x 2 layers x 16 tokens x hidden 64 x float32 (tiny checkpoint)


def run(url, values):
    try:
        return np.concatenate([a for _, a in sorted(stream_grpc(url, values, timeout=300))]), None
    except ServerError as e:
        return None, str(e)


def test_four_times_more_streams_than_the_cache_holds(tmp_path):
    ckpt = tiny_checkpoint(tmp_path / "tiny", seed=0, small_audio=True)
    # 16 blocks of 16 tokens: about 4 streams of ~20 prompt tokens + 40 frames at once
    s = TritonServer(repo=ROOT / "model_repository", log_path=tmp_path / "server.log",
                     env={"VELOCITY_WEIGHTS": str(ckpt), "VELOCITY_KV_CACHE_BYTES": str(16 * BLOCK_BYTES),
                          "VELOCITY_CHUNK_FIRST": "4", "VELOCITY_CHUNK_REST": "8", "VELOCITY_LOOKAHEAD": "4"})
    s.start(timeout=400)
    try:
        req = [{"TEXT": f"Overload stream {i}.", "SEED": i, "MAX_NEW_TOKENS": 40, "REPETITION_PENALTY": 1.0}
               for i in range(16)]
        results: dict = {}
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, run(s.grpc_url, req[i])))
                   for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        assert sorted(results) == list(range(16))
        errors = {i: e for i, (_, e) in results.items() if e}
        assert not errors, f"{errors}\n{s.log()[-3000:]}"
        assert s.metric("velocity_preemptions_total") > 0, "the cache was never full: make it smaller"
        for i in (0, 7, 15):    # what a stream got in the crowd, with preemptions, is what it gets alone
            alone, err = run(s.grpc_url, req[i])
            assert err is None
            assert_same_audio(results[i][0], alone)
        # the gauges are sampled four times a second
        assert wait_for(lambda: s.metric("velocity_kv_blocks_used") == 0 and s.metric("velocity_running_sequences") == 0)
    finally:
        s.stop(at_once=True)
