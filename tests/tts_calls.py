"""What the server tests share: the server fixture's alias, a request through the shipped client,
a seeded recording, and a good request."""
from __future__ import annotations

import subprocess
import sys

import numpy as np

from client.triton import ServerError, stream_grpc
from triton_server import ROOT
from velocity.serving.settings import Settings
from velocity.tts.voices import BUILTIN, DEFAULT_VOICE

# the shared server's chunks (tests/conftest.py: first 4, rest 8, on CPU), for the pipeline to match
SERVED = Settings(chunk_first=4, chunk_rest=8).schedule(gpu=False)


def stream_tts(url: str, values: dict) -> tuple[list[tuple[int, np.ndarray]], str | None]:
    """One request on its own gRPC stream through the shipped client: [(chunk index, audio)], error or None."""
    chunks = []
    try:
        for c in stream_grpc(url, values, timeout=120):
            chunks.append(c)
    except ServerError as e:
        return chunks, str(e)
    return chunks, None


GOOD = {"TEXT": "Hello world. 你好，世界。", "SEED": 7, "MAX_NEW_TOKENS": 24, "TEMPERATURE": 0.8}

# a request that names no voice speaks in the default voice: a seeded draw (TTSPipeline's speaker=seed)
DEFAULT_VOICE_SEED = BUILTIN[DEFAULT_VOICE]


def wav_bytes(seconds: float, rate: int = 16000, amp: float = 0.3, fmt: str = "WAV") -> bytes:
    """A seeded recording (a chirp in noise) as an audio file's bytes."""
    import io

    import soundfile as sf
    rng = np.random.default_rng(11)
    t = np.arange(int(rate * seconds)) / rate
    wave = amp * (np.sin(2 * np.pi * (200 + 120 * t) * t) + 0.2 * rng.standard_normal(t.shape))
    buf = io.BytesIO()
    sf.write(buf, wave.astype(np.float32), rate, format=fmt)
    return buf.getvalue()


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The installed client in a process of its own: a hang fails the test instead of the suite."""
    return subprocess.run([sys.executable, "-m", "client.tts_client", *args], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=timeout)


def one_line(p: subprocess.CompletedProcess) -> str:
    lines = [line for line in (p.stdout + p.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, p.stdout + p.stderr
    return lines[0]
