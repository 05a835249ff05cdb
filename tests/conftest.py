"""Shared fixtures: a real tritonserver on free ports, with gRPC and HTTP clients."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from triton_server import ROOT, TESTS_REPO, TritonServer


@pytest.fixture
def start_triton(tmp_path: Path) -> Iterator[Callable[..., TritonServer]]:
    """Factory: start_triton(repo, env={...}, until="ready"|"live", via_make=False) -> a started
    TritonServer; all are stopped after the test."""
    servers: list[TritonServer] = []

    def start(repo: Path, env: dict[str, str] | None = None, timeout: float = 240.0,
              until: str = "ready", via_make: bool = False) -> TritonServer:
        s = TritonServer(repo=Path(repo), log_path=tmp_path / f"server{len(servers)}.log", env=env or {},
                         via_make=via_make)
        servers.append(s)
        return s.start(timeout=timeout, until=until)

    yield start
    for s in servers:
        s.stop(at_once=True)            # a test that checks a stop stops its server itself


def add_sample_voice(ckpt, name: str = "clone", text: str = "the sample text") -> str:
    """voices.json beside the weights, holding one voice made from a seeded recording: its sample string."""
    import numpy as np

    from velocity.tts.speaker import encode_sample
    from velocity.tts.voice_sample import VoiceEncoder
    from velocity.tts.voices import add_voice

    t = np.arange(24000) / 24000
    wave = (0.3 * np.sin(2 * np.pi * (150 + 100 * t) * t)).astype(np.float32)
    sample = encode_sample(VoiceEncoder(ckpt).encode(wave))
    add_voice(ckpt / "voices.json", name, sample=sample, sample_text=text)
    return sample


@pytest.fixture(scope="session")
def tts_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """model_repository/ on the tiny demo checkpoint with small audio models (frames per sentence
    capped at 200, small chunks; the vocoder's stateful decoders, on by default, run in every test through it), shared
    by tests/server/test_tts_server.py, tests/server/test_readme.py and others."""
    from checkpoints import tiny_checkpoint

    d = tmp_path_factory.mktemp("tts")
    ckpt = tiny_checkpoint(d / "tiny", seed=0, small_audio=True)
    add_sample_voice(ckpt)
    s = TritonServer(repo=ROOT / "model_repository", log_path=d / "server.log",
                     env={"VELOCITY_WEIGHTS": str(ckpt), "VELOCITY_KV_CACHE_BYTES": str(32 << 20),
                          "VELOCITY_MAX_NEW_TOKENS": "200", "VELOCITY_CHUNK_FIRST": "4",
                          "VELOCITY_CHUNK_REST": "8", "VELOCITY_LOOKAHEAD": "4"})
    s.start(timeout=400)
    yield s
    s.stop(at_once=True)


@pytest.fixture(scope="module")
def gateway(tts_server: TritonServer) -> str:
    """The gateway serve.sh started beside the shared server, once healthy: its base URL."""
    import urllib.request

    from triton_server import wait_for

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(tts_server.gateway_url + "/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    assert wait_for(healthy, 60), tts_server.log()
    return tts_server.gateway_url


# One gateway of its own beside serve.sh's, for the tests of settings that the default gateway
# does not have (each gateway start costs seconds): long texts in pieces (over 80 characters, at
# most 500), clients gone after 2 s without reading, small kernel send buffers, an allowed origin,
# small fair-share caps (4 streams and 3 sockets a client, 5 sockets in all, idle 2 s).
SIDE_GATEWAY_ENV = {"VELOCITY_GATEWAY_LONG_TEXT": "1", "VELOCITY_MAX_TEXT_CHARS": "80",
                    "VELOCITY_GATEWAY_LONG_TEXT_MAX_CHARS": "500", "VELOCITY_GATEWAY_SEND_TIMEOUT": "2",
                    "VELOCITY_GATEWAY_SEND_BUFFER_BYTES": "16384", "VELOCITY_GATEWAY_ORIGINS": "https://app.example",
                    "VELOCITY_GATEWAY_MAX_STREAMS_PER_CLIENT": "4", "VELOCITY_GATEWAY_MAX_SOCKETS_PER_CLIENT": "3",
                    "VELOCITY_GATEWAY_MAX_SOCKETS": "5", "VELOCITY_GATEWAY_IDLE_TIMEOUT": "2",
                    "VELOCITY_GATEWAY_REFUSAL_DELAY": "0.5"}


@pytest.fixture(scope="session")
def side_gw(tts_server: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(the base URL, the log) of a gateway with SIDE_GATEWAY_ENV in front of the shared server."""
    from triton_server import side_gateway

    log = tmp_path_factory.mktemp("side-gateway") / "gateway.log"
    with side_gateway(tts_server, log, **SIDE_GATEWAY_ENV) as url:
        yield url, log


@pytest.fixture(scope="module")
def smoke_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """One server on tests/model_repository for the module's smoke tests."""
    s = TritonServer(repo=TESTS_REPO,
                     log_path=tmp_path_factory.mktemp("smoke") / "server.log")
    s.start()
    yield s
    s.stop(at_once=True)


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


def pytest_collection_finish(session: pytest.Session) -> None:
    """tests/tools/test_installs.py's pip installs start now, beside the tests before it, when it runs."""
    for module in {item.module for item in session.items if item.module.__name__ == "test_installs"}:
        module.Installs.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    import sys

    if (module := sys.modules.get("test_installs")) is not None:
        module.Installs.remove()
