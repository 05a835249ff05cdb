"""Every door locked, on a real server with API keys (VELOCITY_GATEWAY_API_KEYS) and a cap of 8
requests in flight: without a key the gateway answers 401, Triton's gRPC and HTTP ports refuse
inference, metadata and config, and its operator APIs refuse too; with the Triton key (serve.sh's
run folder, mode 600) tritonclient, velocity-tts-client, the README's example and
scripts/perf_analyzer.sh speak; direct Triton callers hold at most half the cap, so a flood of
them leaves the gateway's clients served. The server without keys: tests/server/test_web_page.py (no
page can use Triton's HTTP port), tests/server/test_operator_apis.py."""
from __future__ import annotations

import json
import os
import queue
import stat
import subprocess
import sys

import pytest

from triton_server import LONG_TEXT, ROOT, TritonServer, simple_request, wait_for

pytestmark = pytest.mark.server
API_KEY = "sk-door-test-one"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory):
    from checkpoints import tiny_checkpoint

    d = tmp_path_factory.mktemp("doors")
    ckpt = tiny_checkpoint(d / "tiny", seed=0, small_audio=True)
    s = TritonServer(repo=ROOT / "model_repository", log_path=d / "server.log",
                     env={"VELOCITY_WEIGHTS": str(ckpt), "VELOCITY_KV_CACHE_BYTES": str(64 << 20),
                          "VELOCITY_GATEWAY_API_KEYS": f"{API_KEY},sk-door-test-two",
                          "VELOCITY_MAX_CONCURRENT_REQUESTS": "8", "VELOCITY_CHUNK_FIRST": "4",
                          "VELOCITY_CHUNK_REST": "8", "VELOCITY_LOOKAHEAD": "4"})
    s.start(timeout=400)
    yield s
    s.stop(at_once=True)


OFFLINE = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["Hi."]}]}).encode()


def test_without_the_key_every_door_is_refused(keyed: TritonServer):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from client.triton import ServerError, stream_grpc

    speech = json.dumps({"model": "tts-1", "input": "Hello.", "voice": "amber"}).encode()
    assert simple_request(keyed.gateway_url + "/v1/audio/speech", speech, {"Content-Type": "application/json"})[0] == 401
    with pytest.raises(ServerError, match="restricted"):
        list(stream_grpc(keyed.grpc_url, {"TEXT": "Hello."}, timeout=60, check=False))
    with pytest.raises(ServerError, match="restricted"):                 # a wrong key is no key
        list(stream_grpc(keyed.grpc_url, {"TEXT": "Hello."}, timeout=60, check=False, key="not-the-key-at-all"))
    c = grpcclient.InferenceServerClient(keyed.grpc_url)
    try:
        for call in (lambda: c.get_model_metadata("tts"), lambda: c.get_model_config("tts"),
                     lambda: c.infer("tts_offline", [])):
            with pytest.raises(InferenceServerException, match="restricted"):
                call()
        assert c.is_server_ready() and c.is_model_ready("tts")            # health stays open: probes
    finally:
        c.close()
    base = f"http://{keyed.http_url}"
    for headers in ({}, {"velocity-key": "local"}):                     # the keyless server's value is no key here
        status, body = simple_request(base + "/v2/models/tts_offline/infer", OFFLINE, headers)
        assert status == 403 and b"velocity-key" in body, (status, body)
    assert simple_request(base + "/v2/models/tts/config")[0] == 403
    assert simple_request(base + "/v2/logging", b'{"log_verbose_level": 1}')[0] == 403
    # readiness stays open for balancers (the health port polls Triton's, which needs no key)
    assert wait_for(lambda: simple_request(f"http://127.0.0.1:{keyed.health_port}/v2/health/ready")[0] == 200, 30)


def test_with_the_key_tritonclient_the_client_and_the_readme_example_speak(keyed: TritonServer, tmp_path):
    from client.triton import offline_grpc, stream_grpc
    from test_readme import python_snippet, run_snippet

    path = keyed.run_dir / "triton_key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = keyed.triton_key
    assert key == path.read_text().strip() and len(key) >= 16 and key not in keyed.log()
    assert sum(len(a) for _, a in stream_grpc(keyed.grpc_url, {"TEXT": "Hello.", "SEED": 1}, timeout=120, key=key)) > 0
    assert sum(len(a) for _, a in offline_grpc(keyed.grpc_url, {"TEXT": "Hello.", "SEED": 1}, key)) > 0
    status, body = simple_request(f"http://{keyed.http_url}/v2/models/tts_offline/infer", OFFLINE, {"velocity-key": key})
    assert status == 200 and b"WAVEFORM" in body
    for url, mode in ((keyed.grpc_url, []), (keyed.http_url, ["--http"])):
        p = subprocess.run([sys.executable, "-m", "client.tts_client", "Hello.", "-o", str(tmp_path / "h.wav"),
                            "--url", url, *mode], env={**os.environ, "VELOCITY_TRITON_KEY": key},
                           capture_output=True, text=True, timeout=180, cwd=ROOT)
        assert p.returncode == 0 and (tmp_path / "h.wav").stat().st_size > 44, p.stderr
        p = subprocess.run([sys.executable, "-m", "client.tts_client", "Hello.", "-o", str(tmp_path / "n.wav"),
                            "--url", url, *mode], capture_output=True, text=True, timeout=180, cwd=ROOT,
                           env={k: v for k, v in os.environ.items() if k != "VELOCITY_TRITON_KEY"})
        assert p.returncode == 1 and ("restricted" in p.stderr or "403" in p.stderr), p.stderr
    code = python_snippet()
    assert "key = None" in code
    audio = run_snippet(code.replace("key = None", f"key = {{'triton-grpc-protocol-velocity-key': {key!r}}}"), keyed)
    assert audio.size > 0


def perf_analyzer(url: str, out, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "perf_analyzer.sh")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "URL": url, "CONCURRENCY": "1", "REQUESTS": "2", "OUT": str(out), **env})


def test_perf_analyzer_runs_with_the_key_and_on_a_server_without_keys(keyed: TritonServer, tts_server: TritonServer,
                                                                      tmp_path):
    p = perf_analyzer(keyed.grpc_url, tmp_path / "keyed", KEY_FILE=str(keyed.run_dir / "triton_key"))
    assert p.returncode == 0 and "through the key relay" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    for model in ("tts", "tts_offline"):
        assert json.loads((tmp_path / "keyed" / f"{model}_c1.json").read_text())["experiments"], model
    refused = perf_analyzer(keyed.grpc_url, tmp_path / "nokey")                       # no key: no way in
    assert "restricted" in refused.stdout + refused.stderr, refused.stdout[-2000:]
    p = perf_analyzer(tts_server.grpc_url, tmp_path / "open")
    assert p.returncode == 0 and "relay" not in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    assert json.loads((tmp_path / "open" / "tts_c1.json").read_text())["experiments"]


def test_a_flood_of_direct_callers_leaves_the_gateways_clients_served(keyed: TritonServer):
    """8 long streams on Triton's gRPC port, with the key, against a cap of 8: direct callers get
    half (VELOCITY_MAX_DIRECT_REQUESTS' default), the other 4 are refused naming the setting, and a
    client of the gateway (with an API key) is served meanwhile."""
    import tritonclient.grpc as grpcclient

    from velocity.serving.wire.input_table import make_inputs
    from velocity.serving.wire.triton_key import grpc_headers

    headers = grpc_headers(keyed.triton_key)
    clients, firsts = [], queue.Queue()
    try:
        for i in range(8):
            c = grpcclient.InferenceServerClient(keyed.grpc_url)
            clients.append(c)
            seen = []

            def came(result, error, seen=seen) -> None:
                if not seen:
                    seen.append(1)
                    firsts.put(error)
            c.start_stream(callback=came, headers=headers)
            c.async_stream_infer("tts", make_inputs(grpcclient, {"TEXT": LONG_TEXT, "MAX_NEW_TOKENS": 2000, "SEED": i}),
                                 enable_empty_final_response=True)
        answers = [firsts.get(timeout=120) for _ in range(8)]
        refused = [str(e) for e in answers if e is not None]
        assert len(refused) == 4 and all("VELOCITY_MAX_DIRECT_REQUESTS" in e for e in refused), answers
        speech = json.dumps({"model": "tts-1", "input": "Still served.", "voice": "amber"}).encode()
        status, body = simple_request(keyed.gateway_url + "/v1/audio/speech", speech,
                            {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
        assert status == 200 and len(body) > 1000, (status, body[:300])
    finally:
        for c in clients:
            c.stop_stream(cancel_requests=True)
            c.close()

