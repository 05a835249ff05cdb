"""Broken weights: the model fails to load with a log line naming the file (and tensor), the
server stays up and reports not ready, nothing hangs, and stopping it leaves nothing behind.
A weights folder that is not there, or not a release, stops serve.sh before Triton starts.
Stopping with live streams: tests/server/test_lifecycle.py."""
from __future__ import annotations

import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from safetensors.torch import load_file, save_file

from triton_server import ROOT, TritonServer, alive, side_by_side, wait_for
from velocity.serving.boards.core_board import find_boards
from checkpoints import tiny_checkpoint

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("good") / "tiny", seed=0, small_audio=True)


def truncated(good, d):
    ck = shutil.copytree(good, d / "truncated")
    f = ck / "asset" / "gpt" / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return ck, [str(f), "cannot read safetensors"]


def wrong_shape(good, d):
    ck = shutil.copytree(good, d / "wrong_shape")
    f = ck / "asset" / "gpt" / "model.safetensors"
    t = load_file(f)
    t["layers.0.mlp.down_proj.weight"] = t["layers.0.mlp.down_proj.weight"][:, :-1].contiguous()
    save_file(t, f)
    return ck, [str(f), "layers.0.mlp.down_proj.weight", "shape"]


def model_ready(server, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/ready", timeout=5) as r:
            return r.status == 200
    except urllib.error.HTTPError:
        return False


def test_bad_weights_leave_the_server_up_and_not_ready(good, tmp_path):
    """A truncated file and a tensor of the wrong shape, a server each (started and stopped side by
    side: each is mostly loading): up, not ready, the file and the reason in the log."""
    faults = [fault(good, tmp_path) for fault in (truncated, wrong_shape)]
    servers = [TritonServer(repo=ROOT / "model_repository", log_path=tmp_path / f"server{i}.log",
                            env={"VELOCITY_WEIGHTS": str(w), "VELOCITY_KV_CACHE_BYTES": str(8 << 20)})
               for i, (w, _) in enumerate(faults)]

    try:
        side_by_side(lambda s: s.start(timeout=240, until="live"), servers)
        for s, (_, must_say) in zip(servers, faults):
            assert s.health("live") and not s.ready()
            assert not model_ready(s, "llm") and not model_ready(s, "tts")
            log = s.log()
            assert "llm: cannot start the engine" in log, log
            for text in must_say:
                assert text in log, f"{text!r} not in the server log:\n{log}"
        pids = [p for s in servers for p in s.processes()]
        side_by_side(TritonServer.stop, servers)
        assert not [p for p in pids if alive(p)]
        # the llm that failed never finalizes: its core board goes with serve.sh's run folder
        assert not [b for p in pids for b in find_boards(p)]
    finally:
        side_by_side(TritonServer.stop, servers)


@pytest.mark.parametrize("where,says", [("no-such-folder", "does not exist"),
                                        ("empty", "is not a ChatTTS release folder"),
                                        ("no-vocos", "lacks asset/Vocos.safetensors")])
def test_a_wrong_weights_folder_stops_serve_sh_at_once_with_the_reason(good, tmp_path, where, says):
    """It used to start a server that was never ready, with the reason deep in Triton's log."""
    weights = tmp_path / where
    if where == "empty":
        weights.mkdir()
    elif where == "no-vocos":
        shutil.copytree(good, weights)
        (weights / "asset" / "Vocos.safetensors").unlink()
    t0 = time.monotonic()
    p = subprocess.run(["bash", str(ROOT / "scripts" / "serve.sh"), "--weights", str(weights),
                        "--http-port", "1", "--grpc-port", "1", "--metrics-port", "1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and time.monotonic() - t0 < 30, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and str(weights) in lines[0], p.stderr
    assert "tritonserver" not in p.stdout                    # it never started


def test_an_llm_config_without_decoupled_fails_to_load_and_says_why(start_triton, good, tmp_path):
    """initialize reads its model_config: the llm streams, so a config that dropped the decoupled
    policy is refused with the reason, not served with one response per request."""
    repo = tmp_path / "repo"                 # the llm alone: the other models play no part here
    shutil.copytree(ROOT / "model_repository" / "llm", repo / "llm")
    cfg = repo / "llm" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("model_transaction_policy { decoupled: true }", ""))
    s = start_triton(repo, env={"VELOCITY_WEIGHTS": str(good), "VELOCITY_KV_CACHE_BYTES": str(8 << 20)},
                     until="live")
    try:
        assert wait_for(lambda: "must keep model_transaction_policy" in s.log(), timeout=120), s.log()
        assert not model_ready(s, "llm")
    finally:
        s.stop(at_once=True)


def test_a_port_taken_before_triton_binds_it_costs_a_start_on_fresh_ports(start_triton, tmp_path):
    """TritonServer.start: free_port() hands out a port that another process may take before
    Triton binds it (its metrics port seconds later, once the models loaded; a clean clone lost a
    test to that). Triton then exits; the start is made again on fresh ports."""
    import socket

    repo = tmp_path / "repo"                 # the pace model alone: quick to load
    shutil.copytree(ROOT / "model_repository" / "pace", repo / "pace")
    s = TritonServer(repo=repo, log_path=tmp_path / "server.log")
    taken = s.metrics_port
    with socket.socket() as other:           # the port's thief
        other.bind(("0.0.0.0", taken))
        other.listen()
        try:
            s.start(until="live")
            assert s.metrics_port != taken and s.health("live")
            assert "nv_" in s.metrics()                  # Triton's, on the port it moved to
        finally:
            s.stop(at_once=True)
