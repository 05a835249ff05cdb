"""Shared fixtures: a real tritonserver on free ports, with gRPC and HTTP clients."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from triton_server import TESTS_REPO, TritonServer


@pytest.fixture
def start_triton(tmp_path: Path) -> Iterator[Callable[..., TritonServer]]:
    """Factory: start_triton(repo, env={...}, until="ready"|"live") -> a started TritonServer; all are
    stopped after the test."""
    servers: list[TritonServer] = []

    def start(repo: Path, env: dict[str, str] | None = None, timeout: float = 240.0,
              until: str = "ready") -> TritonServer:
        s = TritonServer(repo=Path(repo), log_path=tmp_path / f"server{len(servers)}.log", env=env or {})
        servers.append(s)
        return s.start(timeout=timeout, until=until)

    yield start
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def smoke_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """One server on tests/model_repository for the module's smoke tests."""
    s = TritonServer(repo=TESTS_REPO,
                     log_path=tmp_path_factory.mktemp("smoke") / "server.log")
    s.start()
    yield s
    s.stop()


@pytest.fixture
def grpc_client(smoke_server: TritonServer):
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(smoke_server.grpc_url)
    yield c
    c.close()


@pytest.fixture
def http_client(smoke_server: TritonServer):
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(smoke_server.http_url)
    yield c
    c.close()
