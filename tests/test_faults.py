"""Broken weights: the model fails to load with a log line naming the file (and tensor), the
server stays up and reports not ready, nothing hangs, and stopping it leaves nothing behind.
Stopping with live streams: tests/test_lifecycle.py."""
from __future__ import annotations

import shutil
import urllib.error
import urllib.request

import pytest
from safetensors.torch import load_file, save_file

from triton_server import ROOT, alive, wait_for
from velocity.serving.core_share import find_boards
from velocity.tts.checkpoint import write_checkpoint

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("good") / "tiny", "tiny", seed=0)


def missing(good, d):
    return d / "no-such-folder", ["no-such-folder"]


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


@pytest.mark.parametrize("fault", [missing, truncated, wrong_shape], ids=lambda f: f.__name__)
def test_bad_weights_leave_the_server_up_and_not_ready(start_triton, good, tmp_path, fault):
    weights, must_say = fault(good, tmp_path)
    s = start_triton(ROOT / "model_repository", env={"VELOCITY_WEIGHTS": str(weights),
                                                     "VELOCITY_KV_CACHE_BYTES": str(8 << 20)}, until="live")
    assert s.health("live") and not s.ready()
    assert not model_ready(s, "llm") and not model_ready(s, "tts")
    log = s.log()
    assert "llm: cannot start the engine" in log, log
    for text in must_say:
        assert text in log, f"{text!r} not in the server log:\n{log}"
    pids = s.processes()
    s.stop()
    assert not [p for p in pids if alive(p)]
    # the llm that failed never finalizes: its core board goes with serve.sh's run folder
    assert not [b for p in pids for b in find_boards(p)]
