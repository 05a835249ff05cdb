"""Triton's operator APIs (logging, trace, shared memory, the model repository) need the operator
key on both ports, always: a key made at each start in the run folder (mode 600) unless
VELOCITY_ADMIN_KEY gives one. What perf_analyzer reads (statistics, metadata, config) stays open.
A real server (serve.sh on tests/model_repository)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from triton_server import ROOT, admin_key, simple_request

pytestmark = pytest.mark.server
HEADER = "velocity-admin-key"


def http(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> int:
    return simple_request(f"http://{server.http_url}{path}", body, headers, method, timeout=10)[0]


def test_the_operator_apis_need_the_key_on_http(smoke_server):
    key = admin_key(smoke_server)
    verbose = json.dumps({"log_verbose_level": 1}).encode()
    assert http(smoke_server, "POST", "/v2/logging", verbose) == 403
    assert http(smoke_server, "POST", "/v2/repository/index", b"{}") == 403
    assert http(smoke_server, "POST", "/v2/trace/setting", b"{}") == 403
    assert http(smoke_server, "GET", "/v2/systemsharedmemory/status") == 403
    assert http(smoke_server, "POST", "/v2/logging", verbose, {HEADER: "not-the-key-at-all"}) == 403
    assert http(smoke_server, "POST", "/v2/logging", json.dumps({"log_verbose_level": 0}).encode(), {HEADER: key}) == 200
    assert http(smoke_server, "POST", "/v2/repository/index", b"{}", {HEADER: key}) == 200
    # what perf_analyzer and the dashboards read needs no key
    assert http(smoke_server, "GET", "/v2/models/stats") == 200
    assert http(smoke_server, "GET", "/v2") == 200


def test_the_operator_apis_need_the_key_on_grpc(smoke_server):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    key = admin_key(smoke_server)
    c = grpcclient.InferenceServerClient(smoke_server.grpc_url)
    try:
        for call in (lambda **h: c.update_log_settings({"log_verbose_level": 1}, **h),
                     lambda **h: c.get_model_repository_index(**h),
                     lambda **h: c.get_system_shared_memory_status(**h)):
            with pytest.raises(InferenceServerException, match="restricted"):
                call()
            call(headers={"triton-grpc-protocol-" + HEADER: key})
        c.update_log_settings({"log_verbose_level": 0}, headers={"triton-grpc-protocol-" + HEADER: key})
        assert c.get_server_metadata().name == "triton" and c.get_inference_statistics() is not None
    finally:
        c.close()


@pytest.mark.parametrize("name", ["VELOCITY_ADMIN_KEY", "VELOCITY_TRITON_KEY"])
def test_a_key_that_cannot_be_a_header_value_stops_serve_sh(tmp_path, name):
    """The operator key and the Triton key (tests/server/test_doors.py) go in headers."""
    env = {**os.environ, name: "short,key", "TMPDIR": str(tmp_path)}
    p = subprocess.run(["bash", str(ROOT / "scripts" / "serve.sh"), "--model-repository", str(ROOT / "tests" / "model_repository")],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and f"{name} must be" in p.stderr, p.stderr
    assert not list(tmp_path.iterdir())                    # its run folder went with it
