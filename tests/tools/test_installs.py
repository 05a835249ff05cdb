"""What a user installs: `pip install velocity-tts[gateway]` and `velocity-tts[client]` bring no
torch, and each runs from its own fresh venv: the gateway in front of a running server, the
client's --help and one request. The package is built from a copy of the repository's files, as
pip builds it from a checkout, and run from outside the repository, so that nothing is imported
from the working tree."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = ("gateway", "client")
SHIPPED = ("pyproject.toml", "README.md", "velocity", "client")
pytestmark = pytest.mark.server


class Installs:
    """The two installs, started once: at the end of collection when a test of this module is
    selected (conftest.pytest_collection_finish), so that pip runs beside the tests before these,
    else by the fixture; removed at the session's end."""
    root: Path | None = None
    procs: dict[str, subprocess.Popen] = {}

    @classmethod
    def start(cls) -> None:
        if cls.root is not None:
            return
        cls.root = d = Path(tempfile.mkdtemp(prefix="velocity-installs-"))
        for extra in EXTRAS:
            # a copy each: two builds in one folder share its build/ and one of them fails
            src = d / f"src-{extra}"
            src.mkdir()
            for name in SHIPPED:
                if (ROOT / name).is_dir():
                    shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy(ROOT / name, src / name)
            venv = d / extra
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
            # the tests' pip installs into it (--python): the venv needs none of its own
            cls.procs[extra] = subprocess.Popen(
                [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                 "--no-compile", f"{src}[{extra}]"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    @classmethod
    def wait(cls) -> dict[str, Path]:
        cls.start()
        for extra, p in cls.procs.items():
            out, _ = p.communicate(timeout=400)
            assert p.returncode == 0, f"pip install velocity-tts[{extra}]:\n{out}"
        return {extra: cls.root / extra / "bin" for extra in EXTRAS}

    @classmethod
    def remove(cls) -> None:
        for p in cls.procs.values():
            p.kill()
        if cls.root is not None:
            shutil.rmtree(cls.root, ignore_errors=True)


@pytest.fixture(scope="module")
def venvs() -> dict[str, Path]:
    """extra -> the bin/ of a fresh venv holding velocity-tts[extra], both installed at once."""
    return Installs.wait()


def run(bin_dir: Path, *args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(bin_dir / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("extra", EXTRAS)
def test_the_install_has_no_torch(venvs, extra, tmp_path):
    r = run(venvs[extra], "python", "-c", "import importlib.util as u, velocity; print(u.find_spec('torch'), "
            "u.find_spec('transformers'), velocity.__file__)", cwd=tmp_path)
    torch, transformers, where = r.stdout.split()
    assert (r.returncode, torch, transformers) == (0, "None", "None"), r.stderr
    assert str(ROOT) not in where                          # the installed package, not the checkout


def test_the_client_install_speaks(venvs, tts_server, tmp_path):
    r = run(venvs["client"], "velocity-tts-client", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "--voice" in r.stdout, r.stderr
    r = run(venvs["client"], "velocity-tts-client", "--url", tts_server.grpc_url, "--seed", "3", "-o", "out.wav",
            "Hello from a client without torch.", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    import soundfile as sf

    audio, rate = sf.read(tmp_path / "out.wav")
    assert rate == 24000 and len(audio) > 0
    r = run(venvs["client"], "velocity-tts-voice", "sample.wav", cwd=tmp_path)     # the one tool that needs torch
    assert r.returncode == 2 and "velocity-tts[engine]" in r.stderr, r.stderr


def test_the_gateway_install_serves(venvs, tts_server, tmp_path):
    from benchmarks.replicas import stop_group
    from triton_server import free_port, listening, wait_for

    r = run(venvs["gateway"], "velocity-tts-wyoming", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "--triton" in r.stdout, r.stderr
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    log = tmp_path / "gateway.log"
    gw = subprocess.Popen([str(venvs["gateway"] / "velocity-tts-gateway"), "--triton", tts_server.grpc_url,
                           "--host", "127.0.0.1", "--port", str(port)], cwd=tmp_path, env=env,
                          start_new_session=True, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: listening(port), 60), log.read_text()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/audio/speech", method="POST",
                                     headers={"Content-Type": "application/json"},
                                     data=b'{"model": "tts-1", "voice": "alloy", "input": "Hello.", '
                                          b'"response_format": "wav", "seed": 3}')
        with urllib.request.urlopen(req, timeout=120) as r:
            body = r.read()
        assert body[:4] == b"RIFF" and len(body) > 44, log.read_text()
    finally:
        stop_group(gw, 20)
