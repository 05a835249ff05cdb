"""benchmarks/bench_ab.py's three arms against the real server."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from triton_server import ROOT
from checkpoints import tiny_checkpoint


pytestmark = pytest.mark.server


def test_bench_ab_runs_all_three_arms(server, tmp_path):
    """benchmarks/bench_ab.py: paired rounds of the server, the server without lending, and in-process."""

    ckpt = tiny_checkpoint(tmp_path / "tiny", seed=0, small_audio=True)                 # the server's weights
    out = tmp_path / "ab"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_ab.py"), "--arms", "triton,triton-nolend,in-process",
                        "--url", server.grpc_url, "--metrics-url", f"http://localhost:{server.metrics_port}/metrics", "--rounds", "2", "--requests", "2", "--max-new-tokens", "8",
                        "--weights", str(ckpt), "--board", str(server.core_board()), "--out", str(out)],
                       cwd=str(ROOT), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.with_suffix(".json").read_text())
    assert len(res["rounds"]) == 2 and out.with_suffix(".png").stat().st_size > 0
    for arm in ("triton", "triton-nolend", "in-process"):
        assert res["pooled"][arm]["errors"] == 0 and all(rd[arm]["audio_s"] > 0 for rd in res["rounds"])
    assert all(rd["triton"]["vocoder_queue"]["chunks"] > 0 for rd in res["rounds"])
    for arm in ("triton", "triton-nolend"):            # the server's counters, diffed over each level
        assert all(0 < rd[arm]["vocoder_queue"]["decode_share"] < 2 and rd[arm]["vocoder_queue"]["chunks_per_call"] >= 1
                   and rd[arm]["engine_step_ms"] > 0 for rd in res["rounds"])
        assert res["pooled"][arm]["vocoder_decode_share"] > 0 and res["pooled"][arm]["vocoder_chunks_per_call"] >= 1
    assert "vocoder_decode_share" not in res["pooled"]["in-process"]
    assert all(res["pooled"][a]["rtf_p99_worst_round"] > 0 for a in res["arms"])
    assert set(res["median_ratio_to_triton"]) == {"triton-nolend", "in-process"}
