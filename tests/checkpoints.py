"""The tiny demo checkpoints of the tests: each seed's written once a session (writing the
release-size audio models costs CPU, copying them little) and copied into each test's folder.
small_audio=True: narrow, shallow audio models (velocity.demo.audio_weights.SMALL_STACK), for the
tests that need a server's audio but not the release's vocoder: most of a tiny request's time
is otherwise the vocoder's."""
from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

_written: dict[tuple[int, bool], Path] = {}


def tiny_checkpoint(out: str | Path, seed: int = 0, small_audio: bool = False) -> Path:
    """A copy of write_checkpoint(out, "tiny", seed, small_audio): a folder of its own, free to change."""
    key = (seed, small_audio)
    if key not in _written:
        from velocity.demo.checkpoint import write_checkpoint

        cache = Path(tempfile.mkdtemp(prefix="velocity-tiny-"))
        atexit.register(shutil.rmtree, cache, True)
        _written[key] = write_checkpoint(cache / f"seed{seed}{'-small' if small_audio else ''}", "tiny", seed,
                                         small_audio)
    shutil.copytree(_written[key], out, dirs_exist_ok=True)
    return Path(out)
